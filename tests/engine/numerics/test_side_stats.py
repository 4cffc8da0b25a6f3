"""Side statistics from the metric pass: msit's max/min/mean CSV columns for dumps without any."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from layerwatch.engine.numerics.compare import compare_pair, compare_pairs
from layerwatch.engine.numerics.metrics import MetricAccumulator, paired_chunks
from layerwatch.engine.numerics.segments import small_accumulators
from layerwatch.engine.numerics.thresholds import Thresholds
from layerwatch.engine.records import Locator, Stats, TensorKey, TensorRecord

FLOOR = 1e-6
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "msit"


def reference(x: np.ndarray) -> Stats:
    """Over the finite elements, in float64, the obvious way."""
    x = x.astype(np.float64).ravel()
    fin = x[np.isfinite(x)]
    nan, inf = int(np.isnan(x).sum()), int(np.isinf(x).sum())
    if not fin.size:
        return Stats(math.nan, math.nan, math.nan, 0.0, nan, inf)
    return Stats(fin.max(), fin.min(), fin.mean(), float(np.linalg.norm(fin)), nan, inf)


def assert_stats(got: Stats, want: Stats) -> None:
    assert (got.nan, got.inf) == (want.nan, want.inf)
    for name in ("max", "min", "mean", "norm"):
        a, b = getattr(got, name), getattr(want, name)
        assert (math.isnan(a) and math.isnan(b)) or math.isclose(
            a, b, rel_tol=1e-9, abs_tol=1e-12
        ), (name, got, want)


@st.composite
def arrays(draw) -> tuple[np.ndarray, np.ndarray, list[int], int]:
    n = draw(st.integers(0, 400))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dtype = draw(st.sampled_from([np.float32, np.float64, np.float16]))
    golden = (rng.standard_normal(n) * 10.0 ** draw(st.integers(-4, 4))).astype(dtype)
    target = (golden * (1 + rng.standard_normal(n) * 1e-2)).astype(dtype)
    if draw(st.booleans()):
        target = golden.copy()  # identical bytes: the fast path
    for arr in (golden, target):
        if n and draw(st.booleans()):
            idx = rng.integers(0, n, size=draw(st.integers(1, 5)))
            arr[idx] = rng.choice([np.nan, np.inf, -np.inf], size=idx.size)
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=4)))
    return golden, target, cuts, draw(st.sampled_from([1, 7, 64, 1 << 17]))


@settings(max_examples=200, deadline=None)
@given(arrays())
def test_streamed_side_statistics_equal_the_reference(case) -> None:
    golden, target, cuts, block = case
    acc = MetricAccumulator(FLOOR, block=block, side_stats=True)
    for g, t in paired_chunks(np.split(golden, cuts), np.split(target, cuts)):
        acc.update(g, t)
    g_stats, t_stats = acc.side_stats()
    assert_stats(g_stats, reference(golden))
    assert_stats(t_stats, reference(target))


@settings(max_examples=100, deadline=None)
@given(st.lists(arrays(), min_size=1, max_size=6))
def test_batched_side_statistics_equal_the_reference(cases) -> None:
    pairs = [(g, t) for g, t, _, _ in cases]
    accs = small_accumulators(pairs, FLOOR, side_stats=True)
    for (golden, target), acc in zip(pairs, accs, strict=True):
        g_stats, t_stats = acc.side_stats()
        assert_stats(g_stats, reference(golden))
        assert_stats(t_stats, reference(target))


def _record(path: Path, array: np.ndarray, stats: Stats | None = None) -> TensorRecord:
    path.write_bytes(array.tobytes())
    loc = Locator(str(path), 0, array.nbytes, array.dtype.name, array.shape)
    return TensorRecord(TensorKey(0, "root.x", "output"), array.dtype.name, array.shape, loc, stats)


def test_compare_pair_fills_only_the_sides_without_statistics(tmp_path: Path) -> None:
    th = Thresholds.default()
    rng = np.random.default_rng(5)
    for n in (300, 100_000):  # the batched small path and the streamed path
        g = rng.standard_normal(n).astype(np.float32)
        t = g + np.float32(1e-4)
        recorded = Stats(1.0, -1.0, 0.0, 1.0)
        golden, target = _record(tmp_path / "g", g, recorded), _record(tmp_path / "t", t)
        plain = compare_pair(golden, target, th)
        assert plain.golden_stats is None and plain.target_stats is None  # not asked for
        (asked,) = compare_pairs([(golden, target, False)], th, side_stats=True)
        assert asked.golden_stats is None  # the record's own statistics stand
        assert_stats(asked.target_stats, reference(t))
        assert asked.metrics == plain.metrics  # same metrics either way


def test_csv_report_fills_msits_statistics_columns_for_pth_dumps(tmp_path: Path) -> None:
    import torch  # only to read the fixture back independently

    golden = FIXTURES / "golden" / "msit_dump_fixture"
    target = FIXTURES / "target" / "msit_dump_fixture"
    out = tmp_path / "report.csv"
    command = [sys.executable, "-m", "layerwatch.tui", "compare", golden, target, "-o", out]
    for jobs in ("1", "2"):
        run = subprocess.run(
            [*command, "--jobs", jobs],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode in (0, 1), run.stderr
        rows = [r for r in csv.DictReader(out.open()) if r["verdict"] in ("pass", "fail")]
        assert rows
        for row in rows[:: max(1, len(rows) // 25)]:
            for side, prefix in (("golden_data_path", "golden"), ("my_data_path", "my")):
                values = torch.load(row[side], weights_only=True).double().numpy()
                want = reference(values)
                got = [float(row[f"{prefix}_{k}_value"]) for k in ("max", "min", "mean")]
                assert got == [want.max, want.min, want.mean] or np.allclose(
                    got, [want.max, want.min, want.mean], rtol=1e-9, atol=1e-12
                ), (row["data_id"], got, want)
