"""explain(): statistics, checks, histogram, worst elements and the one-sentence why."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from layerwatch.engine.numerics.compare import compare_pair
from layerwatch.engine.numerics.explain import explain
from layerwatch.engine.numerics.thresholds import Thresholds
from layerwatch.engine.records import (
    COSINE,
    MAX_REL,
    RED,
    Locator,
    TensorKey,
    TensorRecord,
    Verdict,
)

TH = Thresholds.load()
RNG = np.random.default_rng(5)


def record(path: Path, array: np.ndarray, stem: str = "output") -> TensorRecord:
    array.tofile(path)
    loc = Locator(str(path), 0, array.nbytes, array.dtype.name, tuple(array.shape))
    return TensorRecord(
        TensorKey(2, "root.layers.1.mlp", stem), array.dtype.name, tuple(array.shape), loc
    )


def pair(tmp_path: Path, golden: np.ndarray, target: np.ndarray, stem: str = "output"):
    g = record(tmp_path / f"g_{stem}.bin", golden, stem)
    t = record(tmp_path / f"t_{stem}.bin", target, stem)
    return compare_pair(g, t, TH)


def test_worst_elements_histogram_and_sides(tmp_path: Path) -> None:
    golden = RNG.standard_normal((6, 50)).astype(np.float32)
    target = golden + np.float32(1e-6) * RNG.standard_normal(golden.shape).astype(np.float32)
    target[4, 17] += 3.0
    target[1, 2] = np.nan
    result = pair(tmp_path, golden, target)
    detail = explain(result, TH, [], chunk_elems=37)
    first, second = detail.worst[0], detail.worst[1]
    assert first.index == (1, 2) and first.abs_err == np.inf and np.isnan(first.target)
    assert second.index == (4, 17)
    assert second.golden == pytest.approx(float(golden[4, 17]))
    assert second.target == pytest.approx(float(target[4, 17]))
    assert second.abs_err == pytest.approx(3.0, rel=1e-5)
    assert len(detail.worst) == 10
    assert [w.abs_err for w in detail.worst] == sorted(
        (w.abs_err for w in detail.worst), reverse=True
    )
    assert sum(detail.histogram_counts) == golden.size - 1  # the NaN position is not finite
    assert detail.histogram_counts[-1] == 1  # the 3.0 error sits alone in the top bin
    assert detail.histogram_edges[-1] == pytest.approx(result.metrics["max_absolute_error"])
    assert "|target − golden|" in detail.histogram_label
    assert detail.golden is not None and detail.golden.stats is not None
    assert detail.golden.stats.max == pytest.approx(float(golden.max()))
    assert detail.target is not None and detail.target.stats.nan == 1
    assert detail.golden.source.endswith("g_output.bin") and detail.golden.shape == (6, 50)


def test_checks_cover_every_metric(tmp_path: Path) -> None:
    golden = RNG.standard_normal(100).astype(np.float32)
    result = pair(tmp_path, golden, golden * 1.5)
    checks = {c.name: c for c in explain(result, TH, []).checks}
    assert set(checks) == set(result.metrics)
    assert not checks[RED].passed and checks[RED].limit is not None
    assert checks[COSINE].passed and checks[MAX_REL].limit is None


def test_sentence_blames_the_operator_when_its_inputs_pass(tmp_path: Path) -> None:
    x = RNG.standard_normal(64).astype(np.float32)
    inputs = [pair(tmp_path, x, x.copy(), "input_0"), pair(tmp_path, x * 2, x * 2, "input_1")]
    y = x.copy()
    y[:8] = -y[:8]
    output = pair(tmp_path, x, y)
    assert output.verdict is Verdict.FAIL
    text = explain(output, TH, inputs).sentence
    assert text.startswith("output cosine 0.")
    assert text.endswith("while all 2 inputs pass: this operator introduced the error")


def test_sentence_says_upstream_when_an_input_already_differs(tmp_path: Path) -> None:
    x = RNG.standard_normal(64).astype(np.float32)
    noisy = x + RNG.standard_normal(64).astype(np.float32) * 0.3
    inputs = [pair(tmp_path, x, noisy, "input_0")]
    output = pair(tmp_path, np.tanh(x), np.tanh(noisy))
    text = explain(output, TH, inputs).sentence
    assert text.startswith("inputs already differ (input_0 cos 0.9")
    assert text.endswith("error propagated from upstream")


def test_error_and_pass_sentences(tmp_path: Path) -> None:
    x = RNG.standard_normal((4, 4)).astype(np.float32)
    err = pair(tmp_path, x, x.reshape(2, 8))
    detail = explain(err, TH, [])
    assert detail.sentence == "could not compare: shape mismatch: golden [4, 4] vs target [2, 8]"
    assert detail.worst == [] and detail.histogram_counts == []
    ok = explain(pair(tmp_path, x, x.copy()), TH, [])
    assert ok.sentence == "every gated metric is within its limit"
    assert ok.histogram_counts == [16] and ok.worst == []
