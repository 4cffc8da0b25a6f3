"""compare_pair on real files: streamed loads, shape and file errors, statistics-only records."""

from __future__ import annotations

import math
import multiprocessing
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from layerwatch.engine.numerics.arrays import compare_arrays
from layerwatch.engine.numerics.compare import compare_pair, tensor_stats
from layerwatch.engine.numerics.thresholds import Thresholds
from layerwatch.engine.records import (
    COSINE,
    KL,
    NAN_MISMATCH,
    RED,
    Locator,
    Stats,
    TensorKey,
    TensorRecord,
    Verdict,
)

TH = Thresholds.load()
RNG = np.random.default_rng(11)


def npy_record(
    path: Path, array: np.ndarray, node: str = "root.mlp", stem: str = "output"
) -> TensorRecord:
    """Save an ``.npy`` and point a Locator at its payload (offset = file size − payload)."""
    np.save(path, array)
    offset = path.stat().st_size - array.nbytes
    loc = Locator(str(path), offset, array.nbytes, array.dtype.name, tuple(array.shape))
    return TensorRecord(
        TensorKey(0, node, stem), array.dtype.name, tuple(array.shape), loc, source=str(path)
    )


def bf16_record(path: Path, array: np.ndarray) -> TensorRecord:
    """Raw bf16 bytes after a 64-byte junk header."""
    bits = torch.from_numpy(array).bfloat16().view(torch.int16).numpy().tobytes()
    path.write_bytes(b"\xab" * 64 + bits)
    loc = Locator(str(path), 64, len(bits), "bfloat16", tuple(array.shape))
    return TensorRecord(TensorKey(0, "root.mlp", "output"), "bfloat16", tuple(array.shape), loc)


def test_identical_files_pass_with_perfect_metrics(tmp_path: Path) -> None:
    a = RNG.standard_normal((16, 33)).astype(np.float32)
    r = compare_pair(
        npy_record(tmp_path / "g.npy", a), npy_record(tmp_path / "t.npy", a.copy()), TH
    )
    assert r.verdict is Verdict.PASS and bool(r)
    assert r.metrics[COSINE] == 1.0 and r.metrics[RED] == 0.0
    assert r.reason == "" and r.failed == ()
    assert r.key == TensorKey(0, "root.mlp", "output")


def test_bf16_target_against_fp32_golden_is_not_a_failure(tmp_path: Path) -> None:
    a = RNG.standard_normal((8, 100)).astype(np.float32)
    r = compare_pair(npy_record(tmp_path / "g.npy", a), bf16_record(tmp_path / "t.bin", a), TH)
    assert r.verdict is Verdict.PASS, r.reason
    assert r.metrics == compare_arrays(torch.from_numpy(a), torch.from_numpy(a).bfloat16())


def test_streamed_result_equals_in_memory_result_for_small_chunks(tmp_path: Path) -> None:
    a = RNG.standard_normal((7, 53)).astype(np.float32)
    b = (a + RNG.standard_normal(a.shape).astype(np.float32) * 1e-2).astype(np.float32)
    b[3, 3] = np.nan
    g, t = npy_record(tmp_path / "g.npy", a), npy_record(tmp_path / "t.npy", b)
    for chunk in (1, 10, 53, 1000):
        r = compare_pair(g, t, TH, is_logits=True, chunk_elems=chunk)
        want = compare_arrays(a, b, logits=True)
        for name, value in want.items():
            assert r.metrics[name] == pytest.approx(value, rel=1e-9, abs=1e-12), (chunk, name)
    assert r.verdict is Verdict.FAIL and NAN_MISMATCH in r.failed


def test_shape_mismatch_with_equal_numel_is_an_error(tmp_path: Path) -> None:
    a = RNG.standard_normal((10, 100)).astype(np.float32)
    r = compare_pair(
        npy_record(tmp_path / "g.npy", a), npy_record(tmp_path / "t.npy", a.reshape(100, 10)), TH
    )
    assert r.verdict is Verdict.ERROR and not r
    assert r.reason == "shape mismatch: golden [10, 100] vs target [100, 10]"
    assert r.metrics == {}


def test_truncated_file_is_an_error_not_an_exception(tmp_path: Path) -> None:
    a = RNG.standard_normal((64, 64)).astype(np.float32)
    g = npy_record(tmp_path / "g.npy", a)
    t = npy_record(tmp_path / "t.npy", a)
    with open(t.loc.path, "r+b") as fh:
        fh.truncate(t.loc.offset + a.nbytes // 2)
    r = compare_pair(g, t, TH)
    assert r.verdict is Verdict.ERROR
    assert r.reason and "\n" not in r.reason
    assert "t.npy" in r.reason


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    a = np.ones(4, np.float32)
    g = npy_record(tmp_path / "g.npy", a)
    t = npy_record(tmp_path / "t.npy", a)
    os.unlink(t.loc.path)
    r = compare_pair(g, t, TH)
    assert r.verdict is Verdict.ERROR and "t.npy" in r.reason and "\n" not in r.reason


def test_int_files_need_exact_equality(tmp_path: Path) -> None:
    ids = np.arange(12, dtype=np.int64).reshape(1, 12)
    other = ids.copy()
    other[0, 5] = 99
    g = npy_record(tmp_path / "g.npy", ids, stem="input_0")
    assert (
        compare_pair(g, npy_record(tmp_path / "s.npy", ids.copy(), stem="input_0"), TH).verdict
        is Verdict.PASS
    )
    r = compare_pair(g, npy_record(tmp_path / "t.npy", other, stem="input_0"), TH)
    assert r.verdict is Verdict.FAIL and r.failed == ("exact_match_ratio",)


def test_logits_pair_reports_logits_metrics_only_when_asked(tmp_path: Path) -> None:
    a = RNG.standard_normal((1, 3, 50)).astype(np.float32)
    g, t = (
        npy_record(tmp_path / "g.npy", a, node="root.lm_head"),
        npy_record(tmp_path / "t.npy", a * 1.5),
    )
    assert KL not in compare_pair(g, t, TH).metrics
    r = compare_pair(g, t, TH, is_logits=True)
    assert r.is_logits and r.metrics[KL] > 0 and r.verdict is Verdict.FAIL


def stats_record(stats: Stats, dtype: str = "float32", shape=(4, 256)) -> TensorRecord:
    return TensorRecord(TensorKey(1, "root.layers.0", "output"), dtype, shape, None, stats=stats)


def test_statistics_only_records_compare_statistics() -> None:
    golden = Stats(max=3.0, min=-2.9, mean=0.001, norm=32.0)
    near = Stats(max=3.0001, min=-2.9, mean=0.0012, norm=32.001)
    r = compare_pair(stats_record(golden), stats_record(near, "bfloat16"), TH)
    assert r.verdict is Verdict.PASS, r.reason
    # The mean is ≈0 but its error is measured against the tensor's RMS: no explosion.
    assert r.metrics["mean_stat_relative_error"] == pytest.approx(0.0002 / 1.0, rel=1e-6)
    bad = compare_pair(stats_record(golden), stats_record(Stats(3.0, -2.9, 0.001, 38.0)), TH)
    assert bad.verdict is Verdict.FAIL and "l2norm_stat_relative_error" in bad.failed
    assert "statistics limits" in bad.reason
    nan = compare_pair(stats_record(golden), stats_record(Stats(3.0, -2.9, 0.001, 32.0, nan=2)), TH)
    assert nan.verdict is Verdict.FAIL and "target has 2 NaN" in nan.reason


def test_statistics_against_a_tensor_compute_the_missing_side(tmp_path: Path) -> None:
    a = RNG.standard_normal((4, 256)).astype(np.float32)
    a[0, 0] = np.inf
    with_data = npy_record(tmp_path / "g.npy", a)
    s = tensor_stats(with_data.loc, chunk_elems=100)
    finite = a[np.isfinite(a)].astype(np.float64)
    assert (s.max, s.min, s.inf, s.nan) == (finite.max(), finite.min(), 1, 0)
    assert s.norm == pytest.approx(math.sqrt(finite @ finite)) and s.mean == pytest.approx(
        finite.mean()
    )
    only_stats = TensorRecord(with_data.key, "float32", (4, 256), None, stats=s)
    assert compare_pair(with_data, only_stats, TH).verdict is Verdict.PASS
    empty = TensorRecord(with_data.key, "float32", (4, 256), None)
    r = compare_pair(with_data, empty, TH)
    assert r.verdict is Verdict.ERROR and "neither tensor data nor statistics" in r.reason


def _pool_compare(args):
    return compare_pair(*args)


def test_compare_pair_runs_in_a_process_pool(tmp_path: Path) -> None:
    a = RNG.standard_normal(300).astype(np.float32)
    args = (npy_record(tmp_path / "g.npy", a), npy_record(tmp_path / "t.npy", a * 2), TH)
    pickle.dumps(args)
    with multiprocessing.get_context("fork").Pool(1) as pool:
        (result,) = pool.map(_pool_compare, [args])
    assert result.verdict is Verdict.FAIL and result.failed == (RED,)


CAPPED = textwrap.dedent("""
    import resource, sys
    import numpy as np
    from layerwatch.engine.numerics.compare import compare_pair
    from layerwatch.engine.records import Locator, TensorKey, TensorRecord
    from layerwatch.engine.numerics.thresholds import Thresholds

    g_path, t_path, n, cap_mb = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    from layerwatch.engine.numerics import fused
    if sys.argv[5] == "kernel":  # loaded (and its entry point built) before the cap
        fused.load().entry(np.dtype(np.float32), np.dtype(np.float32))
    th = Thresholds.load()
    def rec(path, n):
        loc = Locator(path, 0, 4 * n, "float32", (n,))
        return TensorRecord(TensorKey(0, "root.big", "output"), "float32", (n,), loc)
    compare_pair(rec(g_path, 1 << 16), rec(t_path, 1 << 16), th)  # warm up buffers
    vm_kb = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize"))
    cap = (vm_kb << 10) + (cap_mb << 20)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    try:
        np.empty(n, np.float32)[:] = 1  # one side in memory must not fit under the cap
        print("UNCAPPED")
    except MemoryError:
        pass
    from layerwatch.engine.numerics import compare as cm
    made, make = [], cm._prefetch
    cm._prefetch = lambda *a: made.append(make(*a)) or made[-1]
    r = compare_pair(rec(g_path, n), rec(t_path, n), th, chunk_elems=1 << 20)
    print(r.verdict.value, r.metrics["cosine_similarity"], r.metrics["max_absolute_error"])
    print(fused.loaded(), any(m is not None for m in made))
""")


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["numpy", "kernel", "kernel, read ahead"])
def test_large_pair_compares_under_a_fixed_address_space_cap(tmp_path: Path, engine: str) -> None:
    """2 × 256 MB compare with at most 64 MB of address space above the warm baseline, on the
    numpy path, through the compiled kernel (numerics/fused.py) and with the payloads read
    ahead in a thread (readers/prefetch.py: its ring and stack fit under the cap too)."""
    n = 64 << 20
    g_path, t_path = tmp_path / "g.bin", tmp_path / "t.bin"
    with open(g_path, "wb") as fg, open(t_path, "wb") as ft:
        for start in range(0, n, 1 << 22):
            x = np.sin(np.arange(start, start + (1 << 22), dtype=np.float64) * 1e-3).astype(
                np.float32
            )
            fg.write(x.tobytes())
            x[::4096] += np.float32(1e-3)
            ft.write(x.tobytes())
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    if engine == "numpy":
        env["LAYERWATCH_NO_NUMBA"] = "1"
    env["LAYERWATCH_PREFETCH"] = "1" if engine.endswith("ahead") else "0"
    kind = engine.split(",")[0]
    out = subprocess.run(
        [sys.executable, "-c", CAPPED, str(g_path), str(t_path), str(n), "64", kind],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "UNCAPPED" not in out.stdout
    verdict, cos, max_abs, kernel, ahead = out.stdout.split()
    assert kernel == str(kind == "kernel")
    assert ahead == str(engine.endswith("ahead"))
    assert verdict == "pass"
    assert 0.9999999 < float(cos) < 1.0
    assert float(max_abs) == pytest.approx(1e-3, rel=1e-3)
