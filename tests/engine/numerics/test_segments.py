"""Small pairs measured together (segment reductions) give exactly what each gives alone."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from layerwatch.engine.numerics.compare import compare_pair, compare_pairs
from layerwatch.engine.numerics.metrics import MetricAccumulator
from layerwatch.engine.numerics.segments import BATCH, SMALL, small_metrics
from layerwatch.engine.numerics.thresholds import Thresholds
from layerwatch.engine.readers.load import HELD, load_flat
from layerwatch.engine.readers.pth import pth_locator
from layerwatch.engine.records import COSINE, NORM_REL, Locator, TensorKey, TensorRecord, Verdict

FLOOR = 2.0**-10
TH = Thresholds.default()


@st.composite
def small_pair(draw) -> tuple[np.ndarray, np.ndarray]:
    n = draw(st.integers(0, 300))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dtype = draw(st.sampled_from([np.float32, np.float64, np.float16]))
    golden = (rng.standard_normal(n) * 10.0 ** draw(st.integers(-6, 4))).astype(dtype)
    mode = draw(st.sampled_from(["noise", "same", "zero_golden", "scaled", "negated"]))
    if mode == "noise":
        target = (golden * (1 + rng.standard_normal(n) * 1e-3)).astype(dtype)
    elif mode == "same":
        target = golden.copy()
    elif mode == "zero_golden":
        target, golden = golden.copy(), np.zeros_like(golden)
    elif mode == "scaled":
        with np.errstate(over="ignore"):  # fp16 × 2 may overflow to inf: a case like any other
            target = golden * 2
    else:
        target = -golden
    if n and draw(st.booleans()):
        side = draw(st.sampled_from([golden, target]))
        side[rng.integers(0, n, size=2)] = rng.choice([np.nan, np.inf, -np.inf], size=2)
    return golden, target


def _same(a: dict[str, float], b: dict[str, float]) -> bool:
    """Bit-identical metric dicts (NaN equal to NaN)."""
    return a.keys() == b.keys() and all(
        a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a
    )


@settings(max_examples=120, deadline=None)
@given(st.lists(small_pair(), min_size=1, max_size=12), st.randoms(use_true_random=False))
def test_a_batch_gives_each_pair_what_it_gets_alone(pairs, shuffler) -> None:
    alone = [small_metrics([p], FLOOR)[0] for p in pairs]
    order = list(range(len(pairs)))
    shuffler.shuffle(order)
    batched = small_metrics([pairs[i] for i in order], FLOOR)
    for i, got in zip(order, batched, strict=True):
        assert _same(got, alone[i]), (i, got, alone[i])


@settings(max_examples=120, deadline=None)
@given(small_pair())
def test_segments_agree_with_the_streaming_accumulator(pair) -> None:
    """Same definitions as the (reference-tested) streaming pass, to float64 rounding."""
    golden, target = pair
    acc = MetricAccumulator(FLOOR)
    acc.update(golden, target)
    want = acc.result()
    got = small_metrics([pair], FLOOR)[0]
    assert got.keys() == want.keys()
    for name, value in want.items():
        tol = {"abs_tol": 1e-12} if name in (COSINE, NORM_REL) else {"rel_tol": 1e-12}
        assert got[name] == value or math.isclose(got[name], value, **tol), (name, got, want)


def _record(path: Path, array: np.ndarray, node: str) -> TensorRecord:
    path.write_bytes(b"\0" * 5 + array.tobytes())
    loc = Locator(str(path), 5, array.nbytes, array.dtype.name, array.shape)
    return TensorRecord(TensorKey(0, node, "output"), array.dtype.name, array.shape, loc)


def test_compare_pairs_on_files_equals_compare_pair_one_at_a_time(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    items = []
    for i, n in enumerate([1, 7, 300, SMALL, SMALL + 1, 5000]):
        g = rng.standard_normal(n).astype(np.float32)
        t = (g * (1 + rng.standard_normal(n) * (1e-2 if i % 2 else 1e-7))).astype(np.float16)
        items.append(
            (
                _record(tmp_path / f"g{i}", g, f"n{i}"),
                _record(tmp_path / f"t{i}", t, f"n{i}"),
                False,
            )
        )
    truncated = _record(tmp_path / "gx", np.ones(64, np.float32), "nx")
    (tmp_path / "gx").write_bytes(b"\0" * 20)
    items.insert(2, (truncated, items[0][1], False))  # shape mismatch: an ERROR like alone
    items.insert(3, (truncated, _record(tmp_path / "tx", np.ones(64, np.float32), "nx"), False))
    batched = compare_pairs(items, TH)
    for (g, t, logits), got in zip(items, batched, strict=True):
        want = compare_pair(g, t, TH, is_logits=logits)
        assert (got.verdict, got.failed, got.reason) == (want.verdict, want.failed, want.reason)
        assert _same(got.metrics, want.metrics)
        assert got.golden is g and got.target is t
    assert batched[3].verdict is Verdict.ERROR and "truncated" in batched[3].reason
    assert {r.verdict for i, r in enumerate(batched) if i not in (2, 3)} >= {Verdict.PASS}


def _pth_record(path: Path, tensor: object, node: str) -> TensorRecord:
    import torch

    torch.save(tensor, path)
    loc = pth_locator(path)
    return TensorRecord(TensorKey(0, node, "output"), loc.dtype, loc.shape, loc)


def test_batched_pth_pairs_equal_each_pair_alone_and_the_reference(tmp_path: Path) -> None:
    """msit-style .pth pairs of every kind in one ``compare_pairs`` call — several batches of
    :data:`BATCH` elements, their payloads sliced from the bytes their header read kept —
    give each pair exactly what it gets alone (read from disk), and the streaming reference's
    metrics to float64 rounding."""
    import torch

    torch.manual_seed(5)
    nonfinite = torch.randn(64)
    nonfinite[[3, 9]] = torch.tensor([float("nan"), float("inf")])
    sides = [  # (golden, target)
        (torch.randn(256), torch.randn(256).bfloat16()),
        (torch.randn(4, 16).half(), torch.randn(4, 16)),
        (torch.zeros(100), torch.zeros(100)),
        (torch.zeros(100), torch.randn(100)),
        (nonfinite, nonfinite.bfloat16()),
        (nonfinite, torch.where(nonfinite.isnan(), 0.0, nonfinite)),
        (torch.zeros(0), torch.zeros(0)),
        (torch.arange(50), torch.arange(50) + 1),  # ints and bools: the regular path
        (torch.rand(30) > 0.5, torch.rand(30) > 0.5),
        (torch.full((8,), 3e38), torch.full((8,), 3e38).bfloat16()),
        *((torch.randn(n), torch.randn(n).half()) for n in (SMALL, SMALL - 1, 40_000, 1, 3)),
    ]
    sides += [(torch.randn(n), torch.randn(n).bfloat16()) for n in range(1000, 30_000, 997)]
    assert sum(g.numel() for g, _ in sides) > 3 * BATCH  # several batches
    HELD.clear()
    items = [
        (
            _pth_record(tmp_path / f"g{i}.pth", g, f"n{i}"),
            _pth_record(tmp_path / f"t{i}.pth", t, f"n{i}"),
            False,
        )
        for i, (g, t) in enumerate(sides)
    ]
    paths = [r.loc.path for g, t, _ in items for r in (g, t) if r.loc is not None]
    small = {p for p in paths if Path(p).stat().st_size <= HELD.BIGGEST}
    assert set(HELD.files) == small and len(small) > len(items)
    batched = compare_pairs(items, TH)
    regular = {r.loc.path for g, t, _ in items[6:9] for r in (g, t) if r.loc is not None}
    assert set(HELD.files) == regular  # empty, int, bool: the regular path; the rest sliced
    HELD.clear()
    for (g, t, _), got in zip(items, batched, strict=True):
        want = compare_pair(g, t, TH)  # alone, from disk
        assert (got.verdict, got.failed, got.reason) == (want.verdict, want.failed, want.reason)
        assert _same(got.metrics, want.metrics), (g.key.node, got.metrics, want.metrics)
        if g.dtype in ("int64", "bool") or not g.shape[0]:
            continue
        acc = MetricAccumulator(TH.floor(g.dtype, t.dtype))
        acc.update(load_flat(g.loc), load_flat(t.loc))  # type: ignore[arg-type]
        for name, value in acc.result().items():
            tol = {"abs_tol": 1e-12} if name in (COSINE, NORM_REL) else {"rel_tol": 1e-12}
            have = got.metrics[name]
            assert (
                have == value
                or math.isclose(have, value, **tol)
                or (math.isnan(have) and math.isnan(value))
            ), (g.key.node, name, have, value)
