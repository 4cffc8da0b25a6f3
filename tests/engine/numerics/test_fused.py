"""The compiled single-pass kernel (engine/numerics/fused.py) gives the reference metrics.

The reference is the same :class:`MetricAccumulator` on its numpy path (``LAYERWATCH_NO_NUMBA``),
whose definitions the other metric tests hold. Tolerances: counts, maxima, NaN/Inf figures and
side max/min agree exactly (the same float64 operations per element); sums, means and ratios
of sums to :data:`SUMS_REL` (another summation order); figures that are differences of two
sums (1 − cosine, norm_relative_error) to :data:`CANCEL_ABS` absolute, as their rounding is
relative to the norms, not to the small difference.
"""

from __future__ import annotations

import ctypes
import math
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import astuple

import numpy as np
import pytest
from layerwatch.engine.numerics import fused
from layerwatch.engine.numerics.compare import compare_pairs
from layerwatch.engine.numerics.metrics import MetricAccumulator
from layerwatch.engine.numerics.statistics import tensor_stats
from layerwatch.engine.numerics.thresholds import Thresholds
from layerwatch.engine.records import (
    COSINE,
    EXACT,
    INF_GOLDEN,
    INF_TARGET,
    MAX_ABS,
    MAX_REL,
    NAN_GOLDEN,
    NAN_MISMATCH,
    NAN_TARGET,
    NORM_REL,
    Locator,
    TensorKey,
    TensorRecord,
)

SUMS_REL = 1e-12
CANCEL_ABS = 1e-12
EXACT_NAMES = {MAX_ABS, MAX_REL, NAN_MISMATCH, NAN_GOLDEN, NAN_TARGET, INF_GOLDEN, INF_TARGET}
FLOOR = 1e-3
N = 3 * fused.SUB + 17  # several blocks and a ragged tail


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> Iterator[fused.Kernel]:
    """The kernel loaded for this test only (other tests keep their numpy path)."""
    monkeypatch.delenv("LAYERWATCH_NO_NUMBA", raising=False)
    monkeypatch.setitem(fused._STATE, "kernel", None)
    monkeypatch.setitem(fused._STATE, "failed", False)
    loaded = fused.load()
    if loaded is None:
        pytest.skip("llvmlite is not installed")
    yield loaded


def _measure(g, t, *, exact=False, sides=True, bf16=(False, False), chunk=None):
    acc = MetricAccumulator(FLOOR, exact=exact, side_stats=sides)
    step = chunk or max(g.size, 1)
    for start in range(0, max(g.size, 1), step):
        acc.update(g[start : start + step], t[start : start + step], bf16=bf16)
    return acc.result(), acc.side_stats() if sides else None


def _both(monkeypatch, g, t, **kw):
    """(kernel result, numpy result) of the same pair; asserts the kernel really ran."""
    totals_before = fused._STATE["kernel"]
    assert totals_before is not None
    got = _measure(g, t, **kw)
    monkeypatch.setenv("LAYERWATCH_NO_NUMBA", "1")
    want = _measure(g, t, **kw)
    monkeypatch.delenv("LAYERWATCH_NO_NUMBA")
    return got, want


def _same_value(name: str, a: float, b: float) -> bool:
    if math.isnan(b):
        return math.isnan(a)
    if a == b:
        return True
    if name in EXACT_NAMES or math.isinf(b):
        return False
    return math.isclose(
        a, b, rel_tol=SUMS_REL, abs_tol=CANCEL_ABS if name in (COSINE, NORM_REL) else 0
    )


def _same(got, want) -> None:
    (gm, gs), (wm, ws) = got, want
    assert gm.keys() == wm.keys()
    for name, value in wm.items():
        assert _same_value(name, gm[name], value), (name, gm[name], value)
    if ws is not None:
        for side_got, side_want in zip(gs, ws, strict=True):
            for i, (a, b) in enumerate(zip(astuple(side_got), astuple(side_want), strict=True)):
                assert _same_value(MAX_ABS if i < 2 else "sum", a, b), (i, side_got, side_want)


def _rng() -> np.random.Generator:
    return np.random.default_rng(7)


def _close(dtype, n=N, scale=1.0, noise=1e-3) -> tuple[np.ndarray, np.ndarray]:
    rng = _rng()
    g = (rng.standard_normal(n) * scale).astype(dtype)
    t = (g.astype(np.float64) * (1 + rng.standard_normal(n) * noise)).astype(dtype)
    return g, t


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("noise", [1e-3, 3.0])  # close vectors and far ones (the cosine's branches)
def test_float_pairs(kernel, monkeypatch, dtype, noise) -> None:
    g, t = _close(dtype, noise=noise)
    _same(*_both(monkeypatch, g, t))


def test_mixed_dtypes_and_chunking(kernel, monkeypatch) -> None:
    g, t = _close(np.float64)
    _same(*_both(monkeypatch, g, t.astype(np.float32)))
    _same(*_both(monkeypatch, g.astype(np.float16), t.astype(np.float32), chunk=1000))


def test_bf16_bits_decoded_on_the_fly(kernel, monkeypatch) -> None:
    g, t = _close(np.float32)
    bits = (t.view(np.uint32) >> 16).astype(np.uint16)  # a bf16 target, as the reader hands it
    widened = fused.decode_bf16(bits)
    got = _measure(g, bits, bf16=(False, True))
    monkeypatch.setenv("LAYERWATCH_NO_NUMBA", "1")
    _same(got, _measure(g, widened))  # the numpy path on the float32 values
    _same(got, _measure(g, bits, bf16=(False, True)))  # ... and decoding the bits itself


def test_every_fp16_and_bf16_bit_pattern_decodes_exactly(kernel) -> None:
    """Golden: all 65 536 patterns as float32 (numpy's conversion); target: the same bits read
    by the kernel. Equal values everywhere: no error, NaN/Inf at the same places."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    for target, golden, flag in (
        (bits.view(np.float16), bits.view(np.float16).astype(np.float32), (False, False)),
        (bits, fused.decode_bf16(bits), (False, True)),
    ):
        metrics, sides = _measure(golden, target, bf16=flag)
        assert metrics[MAX_ABS] == 0.0 and metrics[NAN_MISMATCH] == 0.0
        assert metrics[NAN_GOLDEN] == metrics[NAN_TARGET] > 0
        assert metrics[INF_GOLDEN] == metrics[INF_TARGET] == 2
        assert astuple(sides[0]) == astuple(sides[1])


def test_nan_inf_mixes(kernel, monkeypatch) -> None:
    rng = _rng()
    g, t = _close(np.float32)
    for arr in (g, t):
        idx = rng.integers(0, N, 300)
        arr[idx] = rng.choice([np.nan, np.inf, -np.inf], idx.size)
    g[:50] = np.nan  # same class on both sides at a few places
    t[:50] = np.nan
    g[60:70] = np.inf
    t[60:70] = -np.inf
    _same(*_both(monkeypatch, g, t))
    _same(*_both(monkeypatch, g.astype(np.float64), t.astype(np.float16)))


def test_all_nonfinite_zeros_empty(kernel, monkeypatch) -> None:
    nan = np.full(N, np.nan, np.float32)
    zeros = np.zeros(N, np.float32)
    ones = np.ones(N, np.float32)
    for g, t in ((nan, nan), (zeros, zeros.copy() + 0), (zeros, ones), (ones, zeros)):
        _same(*_both(monkeypatch, g, t.copy()))
    empty = np.empty(0, np.float32)
    _same(*_both(monkeypatch, empty, empty))


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")  # the numpy path's squares
def test_denormals_and_huge_values(kernel, monkeypatch) -> None:
    g, t = _close(np.float32, scale=1e-40)  # float32 subnormals
    _same(*_both(monkeypatch, g, t))
    g, t = _close(np.float64, scale=1e-310)  # float64 subnormals
    _same(*_both(monkeypatch, g, t))
    g, t = _close(np.float64, scale=1e200)  # squares overflow to inf
    _same(*_both(monkeypatch, g, t))
    g = np.full(N, np.finfo(np.float32).max, np.float32)
    _same(*_both(monkeypatch, g, -g))


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int8, np.uint8, np.uint16, np.bool_])
def test_integer_and_bool_pairs(kernel, monkeypatch, dtype) -> None:
    rng = _rng()
    info = np.iinfo(dtype) if dtype is not np.bool_ else None
    if info is None:
        g = rng.integers(0, 2, N).astype(bool)
    else:
        g = rng.integers(max(info.min, -1000), min(info.max, 1000), N).astype(dtype)
    t = g.copy()
    t[rng.integers(0, N, 500)] = 1
    got, want = _both(monkeypatch, g, t, exact=True)
    _same(got, want)
    assert got[0][EXACT] == want[0][EXACT] < 1.0


def test_non_contiguous_views(kernel, monkeypatch) -> None:
    g, t = _close(np.float32, n=2 * N)
    _same(*_both(monkeypatch, g[::2], t[1::2]))
    _same(*_both(monkeypatch, g.reshape(2, N)[:, ::3], t.reshape(2, N)[:, ::3]))


def test_chunk_boundaries_do_not_matter(kernel) -> None:
    g, t = _close(np.float32)
    g[5] = np.nan
    whole = _measure(g, t)
    _same(_measure(g, t, chunk=777), whole)


def test_cli_start_up_imports_no_compiler() -> None:
    """``layerwatch --help`` and the engine's import never load numba or llvmlite."""
    code = (
        "import sys, layerwatch.tui.cli, layerwatch.engine.numerics.compare;"
        "print(sorted(m for m in ('numba', 'llvmlite') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_built_kernel_is_reused_without_numba(tmp_path) -> None:
    """A cold cache builds the entry point once; the next process loads it and measures
    without importing numba — and, where the system linker is there, without llvmlite either
    (the linked library, loaded by ctypes)."""
    code = (
        "import sys, numpy as np;"
        "from layerwatch.engine.numerics import fused;"
        "from layerwatch.engine.numerics.metrics import MetricAccumulator;"
        "fused.load();"
        "acc = MetricAccumulator(1e-3);"
        "acc.update(np.arange(5.0, dtype=np.float32), np.arange(5.0, dtype=np.float32) + 1);"
        "assert acc._totals is not None, 'numpy path';"
        "print(acc.result()['max_absolute_error'], 'numba' in sys.modules, 'llvmlite' in sys.modules)"
    )
    env = {"LAYERWATCH_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    runs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        for _ in range(2)
    ]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    linked = fused.can_link()
    assert runs[0].stdout.split() == ["1.0", "True", "True"]  # built here
    assert runs[1].stdout.split() == ["1.0", "False", str(not linked)]  # loaded from the cache
    assert len(list(tmp_path.glob("fused-float32-float32-*.o"))) == 1
    assert len(list(tmp_path.glob("fused-float32-float32-*.so"))) == int(linked)


@pytest.mark.skipif(not fused.can_link(), reason="no system linker: object code only")
@pytest.mark.parametrize(
    "dtypes", [("float32", "uint16"), ("float16", "float16"), ("int32", "int32")]
)
def test_linked_library_measures_like_the_object_code(monkeypatch, tmp_path, dtypes) -> None:
    """The shared library (position-independent code of the same optimised module) and the
    object code llvmlite loads give the very same totals, bit for bit, NaN/Inf blocks included."""
    monkeypatch.setenv("LAYERWATCH_CACHE_DIR", str(tmp_path))
    g, t = _close(np.float32, n=N * 3)
    g[[11, 5000]] = np.nan
    t[[11, 7]] = -np.inf
    if dtypes[1] == "uint16":
        g_op, t_op, kinds = g, (t.view(np.uint32) >> 16).astype(np.uint16), (0, fused.KIND_BF16)
    elif dtypes[0] == "float16":
        g_op, t_op = g.astype(np.float16).view(np.uint16), t.astype(np.float16).view(np.uint16)
        kinds = (fused.KIND_FP16, fused.KIND_FP16)
    else:
        g_op = np.nan_to_num(g * 100, posinf=0, neginf=0).astype(np.int32)
        t_op = np.nan_to_num(t, posinf=0, neginf=0).astype(np.int32)
        kinds = (0, 0)
    totals = []
    for how in ("built", "library", "object code"):  # a cold cache, then each kept form
        if how == "object code":
            for so in tmp_path.glob("*.so"):
                so.unlink()
        kernel = fused.Kernel()
        sums = fused.new_totals()
        assert kernel(g_op, t_op, kinds, FLOOR, False, True, sums)
        totals.append((sums.f.tobytes(), sums.k.tobytes()))
        loaded_library = any(isinstance(e, ctypes.CDLL) for e in kernel._engines)
        assert loaded_library == (how == "library"), how
    assert totals[0] == totals[2]
    assert totals[0] == totals[1]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "int32"])
def test_tensor_stats_through_the_kernel(kernel, monkeypatch, tmp_path, dtype) -> None:
    """scan's statistics of one tensor: the kernel's side sums equal the numpy pass's."""
    g, _ = _close(np.float32)
    g[[3, 9000]] = np.nan
    g[100] = -np.inf
    if dtype == "bfloat16":
        raw = (g.view(np.uint32) >> 16).astype(np.uint16)
    elif dtype == "int32":
        raw = (g[np.isfinite(g)] * 1000).astype(np.int32)
    else:
        raw = g.astype(dtype)
    path = tmp_path / "x.bin"
    raw.tofile(path)
    loc = Locator(str(path), 0, raw.nbytes, dtype, raw.shape)
    got = tensor_stats(loc)
    monkeypatch.setenv("LAYERWATCH_NO_NUMBA", "1")
    want = tensor_stats(loc)
    assert (got.nan, got.inf, got.max, got.min) == (want.nan, want.inf, want.max, want.min)
    assert math.isclose(got.mean, want.mean, rel_tol=SUMS_REL, abs_tol=1e-15)
    assert math.isclose(got.norm, want.norm, rel_tol=SUMS_REL)


def _record(path, raw: np.ndarray, dtype: str, stem: str) -> TensorRecord:
    raw.tofile(path)
    loc = Locator(str(path), 0, raw.nbytes, dtype, raw.shape)
    return TensorRecord(TensorKey(0, "root.mlp", stem), dtype, raw.shape, loc)


def test_compare_pairs_read_bf16_bits_and_batch_small_pairs(kernel, monkeypatch, tmp_path) -> None:
    """The dump path: a bf16 target streamed as its bits, small pairs measured one call each;
    the same metrics and side statistics as the numpy path (reader-decoded, segment batches)."""
    items = []
    for i, n in enumerate((N * 11, 300, 5000)):
        g, t = _close(np.float32, n=n)
        t[7] = np.inf
        bits = (t.view(np.uint32) >> 16).astype(np.uint16)
        stem = f"output.{i}"
        golden = _record(tmp_path / f"g{i}.bin", g, "float32", stem)
        items.append((golden, _record(tmp_path / f"t{i}.bin", bits, "bfloat16", stem), False))
    got = compare_pairs(items, Thresholds.default(), side_stats=True)
    monkeypatch.setenv("LAYERWATCH_NO_NUMBA", "1")
    want = compare_pairs(items, Thresholds.default(), side_stats=True)
    for a, b in zip(got, want, strict=True):
        assert a.verdict == b.verdict and a.failed == b.failed
        _same(
            (a.metrics, (a.golden_stats, a.target_stats)),
            (b.metrics, (b.golden_stats, b.target_stats)),
        )


def test_a_live_sessions_batches_add_up_to_loading_the_kernel(monkeypatch, tmp_path) -> None:
    """Many small batches run by a session's JobRunner (a live session's, a run's windows)
    load the kernel once their elements reach MIN_ELEMS; one alone does not, and neither do
    compares outside a runner (their counts would depend on which process ran them)."""
    from layerwatch.engine.numerics.compare import compare_pair
    from layerwatch.engine.session.jobs import JobRunner, Work

    monkeypatch.delenv("LAYERWATCH_NO_NUMBA", raising=False)
    monkeypatch.setitem(fused._STATE, "kernel", None)
    monkeypatch.setattr(fused, "MIN_ELEMS", 3 * 1000)
    g, t = _close(np.float32, n=1000)
    golden = _record(tmp_path / "g.bin", g, "float32", "o")
    target = _record(tmp_path / "t.bin", t, "float32", "o")
    for _ in range(4):
        compare_pairs([(golden, target, False)], Thresholds.default())
    assert not fused.loaded()
    runner = JobRunner(compare_pair, Thresholds.default(), jobs=1)
    runner.run([Work(golden, target, False)])
    runner.run([Work(golden, target, False)])
    assert not fused.loaded()
    runner.run([Work(golden, target, False)])
    if fused._STATE["failed"]:
        pytest.skip("llvmlite is not installed")
    assert fused.loaded()
