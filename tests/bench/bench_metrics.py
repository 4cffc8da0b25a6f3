"""Benchmark of the numeric core: metric kernel, streamed file compare, start-to-finish, memory.

Run (≈1–2 minutes; one BLAS/OpenMP thread, as msit was measured)::

    python tests/bench/bench_metrics.py                   # all sections
    python tests/bench/bench_metrics.py --sizes 100000 1000000 --skip e2e memory

Throughput counts the fp32 bytes of both inputs (8 bytes per element pair), as msit's own
benchmark does. Baselines measured in the same run: msit 8.2.0's ``compare_data`` (the 7 metrics +
checks, from the side venv ``tests/bench/bench_compare.py`` builds, when it exists) on the same arrays, and the
``np.fromfile`` floor (just reading both files). Figures are minimums of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import json
import math
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
from layerwatch.engine.numerics.arrays import compare_arrays
from layerwatch.engine.numerics.compare import compare_pair
from layerwatch.engine.numerics.thresholds import Thresholds
from layerwatch.engine.records import Locator, TensorKey, TensorRecord

MSIT_PYTHON = (
    Path(tempfile.gettempdir()) / "layerwatch-bench-compare" / "msit-venv" / "bin" / "python"
)
MSIT_DOC = {100_000: 109.0, 1_000_000: 80.0, 10_000_000: 55.0}
"""msit 8.2.0's compare_data MB/s as measured before this project (1 thread)."""
MSIT_E2E_S = 9.27
"""``msit llm compare`` on 468 MB-sized pairs (336.6 MB on disk), incl. start-up."""
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def mbps(n: int, seconds: float) -> float:
    return 8 * n / seconds / 1e6


def bf16_round(x: np.ndarray) -> np.ndarray:
    """fp32 → bf16 (round to nearest even) → fp32, as the loader hands a bf16 target over."""
    bits = x.view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def record(path: Path, dtype: str, shape: tuple[int, ...], nbytes: int) -> TensorRecord:
    loc = Locator(str(path), 0, nbytes, dtype, shape)
    return TensorRecord(TensorKey(0, "root.x", "output"), dtype, shape, loc)


MSIT_KERNEL = textwrap.dedent("""
    import json, sys, time, logging
    import numpy as np, torch
    logging.disable(logging.CRITICAL)
    from msit_llm.compare.cmp_utils import compare_data
    out = {}
    for path_g, path_t, repeats in json.loads(sys.argv[1]):
        g = torch.from_numpy(np.load(path_g)); t = torch.from_numpy(np.load(path_t))
        times = []
        for _ in range(repeats):
            s = time.perf_counter(); compare_data(g, t); times.append(time.perf_counter() - s)
        out[path_g] = min(times)
    print(json.dumps(out))
""")


def section_kernel(sizes: list[int], repeats: int, tmp: Path) -> None:
    print("== metric kernel (in memory, compare_arrays; MB/s of fp32 bytes of both inputs) ==")
    rng = np.random.default_rng(0)
    jobs, rows = [], []
    for n in sizes:
        g = rng.standard_normal(n, dtype=np.float32)
        noisy = (g * (1 + 1e-3 * rng.standard_normal(n, dtype=np.float32))).astype(np.float32)
        bf = bf16_round(g)
        reps = max(3, repeats if n < 10_000_000 else repeats // 2)
        t_noise = best(lambda g=g, t=noisy: compare_arrays(g, t), reps)
        t_bf16 = best(lambda g=g, t=bf: compare_arrays(g, t, rel_floor=2**-10), reps)
        same = g.copy()
        t_same = best(lambda g=g, t=same: compare_arrays(g, t), reps)
        np.save(tmp / f"g{n}.npy", g)
        np.save(tmp / f"t{n}.npy", noisy)
        jobs.append((str(tmp / f"g{n}.npy"), str(tmp / f"t{n}.npy"), max(3, reps)))
        rows.append((n, t_noise, t_bf16, t_same))
    msit = {}
    if MSIT_PYTHON.exists():
        out = subprocess.run(
            [str(MSIT_PYTHON), "-c", MSIT_KERNEL, json.dumps(jobs)],
            capture_output=True,
            text=True,
            env=ENV,
            timeout=600,
        )
        if out.returncode == 0:
            msit = {
                int(Path(k).stem[1:]): v for k, v in json.loads(out.stdout.splitlines()[-1]).items()
            }
        else:
            print("  (msit side venv failed:", out.stderr.strip().splitlines()[-1:], ")")
    print(
        f"  {'elements':>10} {'fp32 noise':>11} {'bf16 target':>12} {'identical':>10} {'msit here':>10} {'ratio':>6} {'msit doc':>9}"
    )
    for n, t_noise, t_bf16, t_same in rows:
        ours = mbps(n, t_noise)
        here = mbps(n, msit[n]) if n in msit else float("nan")
        print(
            f"  {n:>10} {ours:>8.0f} MB/s {mbps(n, t_bf16):>7.0f} MB/s {mbps(n, t_same):>5.0f} MB/s"
            f" {here:>5.0f} MB/s {ours / here:>5.1f}× {MSIT_DOC.get(n, float('nan')):>5.0f} MB/s"
        )


def section_files(sizes: list[int], repeats: int, tmp: Path, th: Thresholds) -> None:
    print("== from files (compare_pair, streamed) vs the np.fromfile floor (read both files) ==")
    rng = np.random.default_rng(1)
    print(
        f"  {'elements':>10} {'target':>7} {'compare_pair':>13} {'fromfile floor':>15} {'of floor':>9}"
    )
    for n in sizes:
        g = rng.standard_normal(n, dtype=np.float32)
        g.tofile(tmp / "g.bin")
        for kind in ("fp32", "bf16"):
            if kind == "fp32":
                (g * np.float32(1.0001)).tofile(tmp / "t.bin")
                t_rec = record(tmp / "t.bin", "float32", (n,), 4 * n)
                dt = np.float32
            else:
                (bf16_round(g).view(np.uint32) >> 16).astype(np.uint16).tofile(tmp / "t.bin")
                t_rec = record(tmp / "t.bin", "bfloat16", (n,), 2 * n)
                dt = np.uint16
            g_rec = record(tmp / "g.bin", "float32", (n,), 4 * n)
            reps = max(3, repeats if n < 10_000_000 else repeats // 2)
            t_cmp = best(lambda g_rec=g_rec, t_rec=t_rec: compare_pair(g_rec, t_rec, th), reps)
            t_floor = best(
                lambda dt=dt: (
                    np.fromfile(tmp / "g.bin", np.float32),
                    np.fromfile(tmp / "t.bin", dt),
                ),
                reps,
            )
            print(
                f"  {n:>10} {kind:>7} {mbps(n, t_cmp):>8.0f} MB/s {mbps(n, t_floor):>10.0f} MB/s"
                f" {t_floor / t_cmp:>8.0%}"
            )


E2E = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from layerwatch.engine.numerics.compare import compare_pair
    from layerwatch.engine.records import Locator, TensorKey, TensorRecord
    from layerwatch.engine.numerics.thresholds import Thresholds
    root, pairs, n = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    th = Thresholds.load()
    fails = 0
    for i in range(pairs):
        g = TensorRecord(TensorKey(0, f"root.n{i}", "output"), "float32", (n,),
                         Locator(str(root / f"g{i}.bin"), 0, 4 * n, "float32", (n,)))
        t = TensorRecord(TensorKey(0, f"root.n{i}", "output"), "bfloat16", (n,),
                         Locator(str(root / f"t{i}.bin"), 0, 2 * n, "bfloat16", (n,)))
        fails += not compare_pair(g, t, th)
    print(fails)
""")
FLOOR = textwrap.dedent("""
    import sys
    from pathlib import Path
    import numpy as np
    root, pairs = Path(sys.argv[1]), int(sys.argv[2])
    for i in range(pairs):
        np.fromfile(root / f"g{i}.bin", np.float32); np.fromfile(root / f"t{i}.bin", np.uint16)
""")


MSIT_E2E = textwrap.dedent("""
    import sys, logging
    from pathlib import Path
    import numpy as np, torch
    logging.disable(logging.CRITICAL)
    from msit_llm.compare.cmp_utils import compare_data
    root, pairs, n = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    for i in range(pairs):
        g = torch.from_numpy(np.fromfile(root / f"g{i}.bin", np.float32))
        t = torch.from_numpy(np.fromfile(root / f"t{i}.bin", np.int16)).view(torch.bfloat16)
        compare_data(g, t)
""")


def section_e2e(repeats: int, tmp: Path) -> None:
    """msit E4's volume: 468 pairs, 56 M element pairs, fp32 golden vs bf16 target (336 MB)."""
    pairs, n = 468, 120_000
    rng = np.random.default_rng(2)
    for i in range(pairs):
        g = rng.standard_normal(n, dtype=np.float32)
        g.tofile(tmp / f"g{i}.bin")
        (bf16_round(g).view(np.uint32) >> 16).astype(np.uint16).tofile(tmp / f"t{i}.bin")
    mb = pairs * n * 6 / 1e6

    def run(code: str, python: str = sys.executable) -> float:
        def once() -> None:
            subprocess.run(
                [python, "-c", code, str(tmp), str(pairs), str(n)],
                check=True,
                env=ENV,
                capture_output=True,
            )

        return best(once, repeats)

    t_ours = run(E2E)
    t_floor = run(FLOOR)
    t_msit = run(MSIT_E2E, str(MSIT_PYTHON)) if MSIT_PYTHON.exists() else math.nan
    t_python = best(
        lambda: subprocess.run([sys.executable, "-c", "import numpy"], check=True, env=ENV), repeats
    )
    print(
        f"== start to finish: new python process, {pairs} pairs, {mb:.0f} MB on disk (fp32 golden, bf16 target) =="
    )
    print(f"  layerwatch compare_pair loop: {t_ours:.2f} s  ({mb / t_ours:.0f} MB/s on disk)")
    print(
        f"  np.fromfile floor (same process shape): {t_floor:.2f} s → {t_floor / t_ours:.0%} of floor"
    )
    print(f"  python + numpy start-up alone: {t_python:.2f} s")
    print(
        f"  msit compare_data loop, same files (side venv; no msit CLI/file checks): {t_msit:.2f} s"
        f" → {t_msit / t_ours:.1f}× faster"
    )
    print(
        f"  msit llm compare (msit.md E4, 336.6 MB): {MSIT_E2E_S:.2f} s → {MSIT_E2E_S / t_ours:.1f}× faster"
        f" (goal ≥ 10×: < {MSIT_E2E_S / 10:.2f} s)"
    )


MEMORY = textwrap.dedent("""
    import sys
    from layerwatch.engine.numerics.compare import compare_pair
    from layerwatch.engine.records import Locator, TensorKey, TensorRecord
    from layerwatch.engine.numerics.thresholds import Thresholds
    g_path, t_path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    th = Thresholds.load()
    rec = lambda p, n: TensorRecord(TensorKey(0, "root.big", "output"), "float32", (n,),
                                    Locator(p, 0, 4 * n, "float32", (n,)))
    def hwm_mb():  # peak RSS of this process image (ru_maxrss would carry the parent's over exec)
        return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) // 1024
    compare_pair(rec(g_path, 1 << 16), rec(t_path, 1 << 16), th)
    before = hwm_mb()
    r = compare_pair(rec(g_path, n), rec(t_path, n), th)
    print(before, hwm_mb(), r.verdict.value)
""")


def section_memory(sizes_mb: list[int], tmp: Path) -> None:
    print(
        "== memory: peak RSS growth of one compare_pair (fp32 vs fp32, default chunks of compare.CHUNK elements, read into reused buffers) =="
    )
    for size in sizes_mb:
        n = (size << 20) // 4
        with open(tmp / "mg.bin", "wb") as fg, open(tmp / "mt.bin", "wb") as ft:
            for start in range(0, n, 1 << 22):
                x = np.sin(np.arange(start, min(n, start + (1 << 22)), dtype=np.float64)).astype(
                    np.float32
                )
                fg.write(x.tobytes())
                ft.write((x * np.float32(1.00001)).tobytes())
        start = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", MEMORY, str(tmp / "mg.bin"), str(tmp / "mt.bin"), str(n)],
            capture_output=True,
            text=True,
            env=ENV,
            check=True,
        )
        before, after, verdict = out.stdout.split()
        print(
            f"  2 × {size} MB: peak RSS {before} → {after} MB (growth {int(after) - int(before)} MB),"
            f" {verdict}, {time.perf_counter() - start:.1f} s"
        )
        (tmp / "mg.bin").unlink()
        (tmp / "mt.bin").unlink()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--memory-mb", type=int, nargs="+", default=[256, 1024])
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["kernel", "files", "e2e", "memory"]
    )
    args = parser.parse_args()
    th = Thresholds.load()
    with tempfile.TemporaryDirectory(prefix="lw-bench-") as tmp_name:
        tmp = Path(tmp_name)
        if "kernel" not in args.skip:
            section_kernel(args.sizes, args.repeats, tmp)
        if "files" not in args.skip:
            section_files(args.sizes, args.repeats, tmp, th)
        if "e2e" not in args.skip:
            section_e2e(max(3, args.repeats // 2), tmp)
        if "memory" not in args.skip:
            section_memory(args.memory_mb, tmp)


if __name__ == "__main__":
    main()
