"""Logits metrics: KL per row in float64, top-1 with margin, top-k overlap, streaming rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from layerwatch.engine.numerics.arrays import compare_arrays
from layerwatch.engine.numerics.logits import (
    MAX_VOCAB,
    LogitsAccumulator,
    logits_metrics,
    logits_shaped,
    row_blocks,
)
from layerwatch.engine.numerics.thresholds import Thresholds
from layerwatch.engine.records import COSINE, KL, MARGIN, TOP1, TOPK, Verdict

ARRAY_TYPES = pytest.mark.parametrize(
    "array_type", [np.asarray, torch.as_tensor], ids=["numpy", "torch"]
)
VOCAB = 200


def logits(rows: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((1, rows, VOCAB)) * 3).astype(np.float32)


def judge(m: dict[str, float], t_dtype: str = "float32"):
    return Thresholds.load().judge(
        m, node="root.lm_head", golden_dtype="float32", target_dtype=t_dtype, is_logits=True
    )


def kl_reference(g: np.ndarray, t: np.ndarray) -> float:
    """Max over rows of KL(softmax g || softmax t), via torch in float64."""
    lg = torch.log_softmax(torch.as_tensor(g, dtype=torch.float64), -1)
    lt = torch.log_softmax(torch.as_tensor(t, dtype=torch.float64), -1)
    return float((lg.exp() * (lg - lt)).sum(-1).max())


@ARRAY_TYPES
def test_identical_logits_have_zero_kl(array_type) -> None:
    g = logits(4)
    m = compare_arrays(array_type(g), array_type(g.copy()), logits=True)
    assert m[KL] == 0.0 and m[TOP1] == 1.0 and m[TOPK] == 1.0 and m[MARGIN] == 0.0
    assert judge(m)[0] is Verdict.PASS


@ARRAY_TYPES
def test_kl_is_per_row_max_and_matches_float64_reference(array_type) -> None:
    g = logits(6)
    t = g.copy()
    t[0, 4] += np.random.default_rng(1).standard_normal(VOCAB).astype(np.float32)
    m = compare_arrays(array_type(g), array_type(t), logits=True)
    assert m[KL] == pytest.approx(kl_reference(g[0], t[0]), rel=1e-9)
    assert m[KL] > 0.05


def test_kl_of_bf16_logits_is_float64_not_bf16() -> None:
    """msit computes KL in the target dtype: ≈0.01 for near-identical bf16 logits."""
    g = torch.as_tensor(logits(8, seed=3))
    t = g.bfloat16()
    m = compare_arrays(g, t, logits=True)
    want = kl_reference(g.numpy()[0], t.float().numpy()[0])
    assert m[KL] == pytest.approx(want, rel=1e-6)
    assert m[KL] < 1e-3
    bf16_kl = (
        torch.nn.functional.kl_div(
            torch.log_softmax(t, -1), torch.softmax(g.bfloat16(), -1), reduction="none"
        )
        .sum(-1)
        .max()
    )
    assert abs(float(bf16_kl) - m[KL]) > 10 * m[KL]  # what computing in bf16 would have given
    assert judge(m, "bfloat16")[0] is Verdict.PASS


@ARRAY_TYPES
def test_near_tie_flip_passes(array_type) -> None:
    g = logits(4)
    row = g[0, 2]
    top1, top2 = np.argsort(row)[-1], np.argsort(row)[-2]
    row[top2] = row[top1] - 1e-3  # near-tie in the golden run
    t = g.copy()
    t[0, 2, top2] += 2e-3  # the target flips it
    m = compare_arrays(array_type(g), array_type(t), logits=True)
    assert m[TOP1] == 0.75
    assert m[MARGIN] == pytest.approx(1e-3, rel=1e-2)
    assert judge(m)[0] is Verdict.PASS


@ARRAY_TYPES
def test_confident_flip_fails(array_type) -> None:
    g = logits(4)
    row = g[0, 1]
    top1 = np.argmax(row)
    row[top1] += 5.0  # confident golden choice
    t = g.copy()
    t[0, 1, top1] -= 10.0
    m = compare_arrays(array_type(g), array_type(t), logits=True)
    assert m[TOP1] == 0.75
    assert m[MARGIN] > 5.0
    verdict, failed, reason = judge(m)
    assert verdict is Verdict.FAIL
    assert TOP1 in failed
    assert "top-1 agreement 0.75 < 1 with golden top-2 margin" in reason


def test_topk_overlap_counts_shared_indices() -> None:
    g = np.arange(10, dtype=np.float32)[None, :]  # top-5 = {5..9}
    t = g.copy()
    t[0, 0] = 100.0  # index 0 enters target's top-5, index 5 leaves
    m = logits_metrics(g, t, k=5)
    assert m[TOPK] == pytest.approx(4 / 5)
    assert m[TOP1] == 0.0


def test_kl_never_over_a_flattened_activation() -> None:
    g = logits(3)
    assert KL not in compare_arrays(g, g * 1.01)
    assert KL in compare_arrays(g, g * 1.01, logits=True)


def test_vocab_axis_other_than_last() -> None:
    g = logits(5)
    t = g.copy()
    t[0, 3, 7] += 4.0
    moved = compare_arrays(np.moveaxis(g, -1, 1), np.moveaxis(t, -1, 1), logits=True, vocab_axis=1)
    last = compare_arrays(g, t, logits=True)
    assert moved[KL] == pytest.approx(last[KL]) and moved[TOP1] == last[TOP1]


def test_nonfinite_rows_are_left_out_of_kl_and_masked_vocab_works() -> None:
    g = logits(3)
    g[0, 0, :10] = -np.inf  # a masked vocabulary slice is fine on both sides
    t = g.copy()
    t[0, 1, 5] = np.nan
    m = compare_arrays(g, t, logits=True)
    assert m[KL] == 0.0  # row 1 is excluded, rows 0 and 2 are identical
    verdict, failed, _ = judge(m)
    assert verdict is Verdict.FAIL and failed == ("nonfinite_mismatch",)


def test_row_blocks_regroup_any_chunking() -> None:
    g = logits(7).reshape(-1)
    t = g + 1
    cuts = [13, 14, 350, 351, 1000]
    pairs = list(zip(np.split(g, cuts), np.split(t, cuts), strict=True))
    rows = list(row_blocks(pairs, VOCAB))
    joined = np.concatenate([r[0] for r in rows])
    assert joined.shape == (7, VOCAB)
    np.testing.assert_array_equal(joined, g.reshape(7, VOCAB))
    acc = LogitsAccumulator(VOCAB)
    for rg, rt in rows:
        acc.update(rg, rt)
    assert acc.result() == logits_metrics(g.reshape(7, VOCAB), t.reshape(7, VOCAB))


def test_row_blocks_reuse_safe_when_a_row_spans_many_chunks() -> None:
    """A row longer than a chunk is gathered from pieces joined once; the chunks may be one
    buffer refilled in place (iter_chunks(reuse=True)), so the pieces must be copies."""
    vocab, chunk = 1000, 64
    g = np.arange(3 * vocab, dtype=np.float32)
    buf_g, buf_t = np.empty(chunk, np.float32), np.empty(chunk, np.float32)

    def refilled():
        for start in range(0, g.size, chunk):
            n = min(chunk, g.size - start)
            buf_g[:n], buf_t[:n] = g[start : start + n], -g[start : start + n]
            yield buf_g[:n], buf_t[:n]

    rows = [(rg.copy(), rt.copy()) for rg, rt in row_blocks(refilled(), vocab)]
    np.testing.assert_array_equal(np.concatenate([r[0] for r in rows]), g.reshape(3, vocab))
    np.testing.assert_array_equal(np.concatenate([r[1] for r in rows]), -g.reshape(3, vocab))
    with pytest.raises(ValueError, match="inside a row"):
        list(row_blocks(iter([(g[:10], g[:10])]), vocab))


def test_only_logits_shaped_tensors_are_rows() -> None:
    assert logits_shaped((1, 4, 32000)) and logits_shaped((32000,), one_row=True)
    assert not logits_shaped((1 << 26,))  # a 1-D root output: a plain tensor
    assert not logits_shaped((1 << 26,), one_row=True)  # no vocabulary is that long
    assert not logits_shaped((4, MAX_VOCAB + 1))


def test_scaled_logits_fail_on_cosine_neutral_but_kl() -> None:
    g = logits(4)
    m = compare_arrays(g, g * 2, logits=True)
    assert m[COSINE] == pytest.approx(1.0)
    verdict, failed, _ = judge(m)
    assert verdict is Verdict.FAIL and KL in failed
