"""End-to-end ``layerwatch compare`` vs ``msit llm compare -cl api`` on the same msit dumps.

    . .venv/bin/activate && python tests/bench/bench_compare.py [--cases a b] [--repeat 3]

The dumps are written once by msit 8.2.0 itself (``register_hook`` in msit's own side venv,
which the bench builds under ``--work`` on first use, or ``--msit VENV``) into ``--work`` (default
``/tmp/layerwatch-bench-compare``), for two cases:

(a) MB-sized tensors, like E4: HF Llama hidden 1024, 8 layers, 16 heads, vocab 32000, prompt 256,
    4 new tokens; golden fp32 vs target bf16 (msit measured ≈36 MB/s, 336 MB in 9.3 s).
(b) many small tensors, like E1: hidden 256, 4 layers, vocab 1000, prompt 16, 8 new tokens;
    golden fp32 vs target bf16 (msit measured 75-220 pairs/s).

Both tools run as fresh processes (start-up included), with ``OMP_NUM_THREADS=1`` as msit's
figures were taken, in the same run, medians of ``--repeat``; ours also once more without the
compiled metric kernel (``LAYERWATCH_NO_NUMBA=1``, ``engine/numerics/fused.py``), and with the
next payloads read in a thread forced on and off, alternating (``LAYERWATCH_PREFETCH=1``/``0``,
``engine/readers/prefetch.py``; by default the thread runs only with a spare core). The floor
is reading every payload of both dumps once (our readers' locators + ``load_array``, in one
process, no metrics), also read once beside each timed ``--jobs`` run, alternating (a floor read
under the same load: this box's load drifts by the minute); the whole-process floor does the
same in a fresh interpreter (start-up, numpy and our readers' imports included: where start-up
bounds any Python tool). ``--jobs`` values timed: 1, 0 (the default: this process and one more
per core the load average leaves idle, ``capture/cpus.py``, so at a load of cores − ½ or more it
is ``--jobs 1``) and 2 (two processes whatever the load); each row prints the load average it
started at. ``--before-python PY`` (another build's interpreter, e.g. main's) times that build's
compare beside ours for each ``--jobs`` value, alternating which goes first, and prints the
medians of the pairs' wall and CPU ratios (same dumps, same minutes).
Goals: ≥ 20× msit on (a) and (b), ≥ 60 % of the load floor on (a).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = {
    "a": {
        "hidden": 1024,
        "layers": 8,
        "heads": 16,
        "inter": 2816,
        "vocab": 32000,
        "prompt": 256,
        "new": 4,
    },
    "b": {
        "hidden": 256,
        "layers": 4,
        "heads": 4,
        "inter": 688,
        "vocab": 1000,
        "prompt": 16,
        "new": 8,
    },
}


# --- dump generation (runs inside the msit side venv) ---------------------------------------
def make_dump(case: str, side: str, out: Path, tool: str = "msit") -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if tool == "msit":
        from msit_llm import DumpConfig, register_hook
    else:
        from layerwatch.capture import DumpConfig, register_hook

    c = CASES[case]
    torch.manual_seed(1234)
    config = LlamaConfig(
        hidden_size=c["hidden"],
        intermediate_size=c["inter"],
        num_hidden_layers=c["layers"],
        num_attention_heads=c["heads"],
        num_key_value_heads=c["heads"],
        vocab_size=c["vocab"],
        max_position_embeddings=1024,
        attn_implementation="eager",
    )
    model = LlamaForCausalLM(config).eval()
    if side == "target":
        model = model.to(torch.bfloat16)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    handle = register_hook(model, DumpConfig(dump_path=str(out), token_range=list(range(c["new"]))))
    prompt = torch.randint(
        0, c["vocab"], (1, c["prompt"]), generator=torch.Generator().manual_seed(7)
    )
    with torch.no_grad():
        model.generate(prompt, max_new_tokens=c["new"], do_sample=False, pad_token_id=0)
    if tool != "msit":
        handle.close()  # flush: every tensor on disk


def rank_dir(side_dir: Path) -> Path:
    (dump,) = side_dir.glob("msit_dump_*")
    (rank,) = (dump / "torch_tensors").iterdir()
    return rank


def ensure_msit_venv(venv: Path) -> Path:
    """msit's own environment, as its documentation installs it, built once under the work dir."""
    if (venv / "bin" / "msit").exists() and (venv / ".llm-installed").exists():
        return venv
    print(f"[bench] building msit's side venv in {venv} (once, a few minutes) ...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0", "msit==8.2.0", "transformers"], check=True)
    # `msit install llm` asks for confirmation on stdin
    subprocess.run(
        [str(venv / "bin" / "msit"), "install", "llm"], input="y\n" * 8, text=True, check=True
    )
    (venv / ".llm-installed").touch()
    return venv


def ensure_dumps(work: Path, case: str, msit_python: Path) -> tuple[Path, Path]:
    dirs = []
    for side in ("golden", "target"):
        side_dir = work / case / side
        if not list(side_dir.glob("msit_dump_*/torch_tensors/*/model_tree.json")):
            print(
                f"[bench] writing case {case} {side} with msit's register_hook ...", file=sys.stderr
            )
            env = dict(os.environ, OMP_NUM_THREADS="1")
            subprocess.run(
                [str(msit_python), __file__, "--make", case, side, str(side_dir)],
                check=True,
                env=env,
            )
        dirs.append(rank_dir(side_dir))
    return dirs[0], dirs[1]


def ensure_layerwatch_dumps(work: Path, case: str) -> tuple[Path, Path]:
    """The same model and prompt captured by our own ``register_hook`` (layerwatch format)."""
    dirs = []
    for side in ("golden", "target"):
        side_dir = work / case / f"layerwatch-{side}"
        if not list(side_dir.glob("*/index.jsonl")):
            print(
                f"[bench] writing case {case} {side} with layerwatch's register_hook ...",
                file=sys.stderr,
            )
            env = dict(os.environ, OMP_NUM_THREADS="1")
            cmd = [
                sys.executable,
                __file__,
                "--make",
                case,
                side,
                str(side_dir),
                "--tool",
                "layerwatch",
            ]
            subprocess.run(cmd, check=True, env=env)
        dirs.append(side_dir)
    return dirs[0], dirs[1]


# --- timing ---------------------------------------------------------------------------------
def timed(cmd: list[str], env: dict[str, str], repeat: int) -> tuple[list[float], list[float], str]:
    """Wall and CPU seconds (user + system of the process and its workers) of each run."""
    import resource

    walls, cpus, out = [], [], ""
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if proc.returncode not in (0, 1):
            raise SystemExit(
                f"[bench] {' '.join(cmd[:4])} failed ({proc.returncode}): {proc.stderr[-2000:]}"
            )
        out = proc.stdout
    return walls, cpus, out


def load_floor(golden: Path, target: Path, repeat: int) -> tuple[float, int, int]:
    """Seconds to read every payload of both dumps once (median), bytes, tensors."""
    from layerwatch.engine.readers import open_dump
    from layerwatch.engine.readers.load import load_array

    times, nbytes, count = [], 0, 0
    for _ in range(repeat):
        start = time.perf_counter()
        nbytes = count = 0
        for path in (golden, target):
            update = open_dump(path).poll(None)
            for record in update.tensors:
                if record.loc is not None:
                    load_array(record.loc)
                    nbytes += record.loc.nbytes
                    count += 1
        times.append(time.perf_counter() - start)
    return statistics.median(times), nbytes, count


PROCESS_FLOOR = """
import sys
from layerwatch.engine.readers import open_dump
from layerwatch.engine.readers.load import load_array
for path in sys.argv[1:]:
    for record in open_dump(path).poll(None).tensors:
        if record.loc is not None:
            load_array(record.loc)
"""
"""The whole-process floor: a fresh interpreter imports numpy and our readers and reads every
payload once (what any Python tool pays before its first metric, start-up included)."""


def process_floor(golden: Path, target: Path, env: dict[str, str], repeat: int) -> dict[str, float]:
    """Medians (wall, CPU) of the whole-process floor and of its first parts: a bare
    interpreter and one that imports numpy, alternating."""
    parts = {
        "python": [sys.executable, "-c", "pass"],
        "numpy": [sys.executable, "-c", "import numpy"],
        "proc_floor": [sys.executable, "-c", PROCESS_FLOOR, str(golden), str(target)],
    }
    runs: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in parts}
    timed(parts["proc_floor"], env, 1)  # warm-up: byte code cached
    for _ in range(repeat):
        for name, cmd in parts.items():
            walls, cpus, _ = timed(cmd, env, 1)
            runs[name][0].extend(walls)
            runs[name][1].extend(cpus)
    out = {}
    for name, (walls, cpus) in runs.items():
        out[f"{name}_s"], out[f"{name}_cpu"] = statistics.median(walls), statistics.median(cpus)
    return out


def bench_case(case: str, args: argparse.Namespace) -> dict[str, float]:
    golden, target = ensure_dumps(args.work, case, args.msit / "bin" / "python")
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: byte code cached after the first run
    floor_s, nbytes, tensors = load_floor(golden, target, args.repeat)  # also warms the page cache
    ours = [sys.executable, "-m", "layerwatch.tui", "compare", str(golden), str(target), "--json"]
    timed(ours, env, 1)  # warm-up: writes __pycache__ once, builds the compiled kernel once
    row: dict[str, float] = {"MB": nbytes / 1e6, "tensors": tensors, "floor_s": floor_s}
    row.update(process_floor(golden, target, env, args.repeat))
    row["load_start"] = os.getloadavg()[0]
    walls, cpus, _ = timed([*ours, "--jobs", "1"], dict(env, LAYERWATCH_NO_NUMBA="1"), args.repeat)
    row["numpy_j1_s"], row["numpy_j1_cpu"] = statistics.median(walls), statistics.median(cpus)
    # the reader thread (engine/readers/prefetch.py) forced on and off, alternating
    ahead: dict[str, tuple[list[float], list[float]]] = {"1": ([], []), "0": ([], [])}
    for _ in range(args.repeat):
        for knob, (w, c) in ahead.items():
            walls, cpus, _ = timed([*ours, "--jobs", "1"], dict(env, LAYERWATCH_PREFETCH=knob), 1)
            w += walls
            c += cpus
    for knob, (w, c) in ahead.items():
        row[f"ahead{knob}_s"], row[f"ahead{knob}_cpu"] = statistics.median(w), statistics.median(c)
    # each --jobs value alternating with a read of the load floor, so that a box whose load
    # drifts (other jobs come and go) gives each run a floor read under the same load
    runs: dict[int, tuple[list[float], list[float], list[float]]] = {
        j: ([], [], []) for j in args.jobs
    }
    loads: dict[int, list[float]] = {j: [] for j in args.jobs}
    before = [str(args.before_python), *ours[1:]] if args.before_python else None
    theirs: dict[int, tuple[list[float], list[float]]] = {j: ([], []) for j in args.jobs}
    if before is not None:
        timed(before, env, 1)  # its warm-up
    for i in range(args.repeat):
        for jobs, (w, c, f) in runs.items():
            f.append(load_floor(golden, target, 1)[0])
            loads[jobs].append(os.getloadavg()[0])
            if before is not None and i % 2:  # the other build first every other round
                tw, tc, _ = timed([*before, "--jobs", str(jobs)], env, 1)
                theirs[jobs][0].extend(tw)
                theirs[jobs][1].extend(tc)
            walls, cpus, out = timed([*ours, "--jobs", str(jobs)], env, 1)
            w += walls
            c += cpus
            row["pairs"] = json.loads(out)["summary"]["pairs"]
            if before is not None and not i % 2:
                tw, tc, _ = timed([*before, "--jobs", str(jobs)], env, 1)
                theirs[jobs][0].extend(tw)
                theirs[jobs][1].extend(tc)
    for jobs, (tw, tc) in theirs.items():
        if tw:
            ow, oc = runs[jobs][0], runs[jobs][1]
            row[f"before_j{jobs}_s"], row[f"before_j{jobs}_cpu"] = (
                statistics.median(tw),
                statistics.median(tc),
            )
            row[f"ratio_j{jobs}_s"] = statistics.median(a / b for a, b in zip(ow, tw, strict=True))
            row[f"ratio_j{jobs}_cpu"] = statistics.median(
                a / b for a, b in zip(oc, tc, strict=True)
            )
    for jobs, (walls, cpus, floors) in runs.items():
        row[f"ours_j{jobs}_s"] = statistics.median(walls)
        row[f"ours_j{jobs}_min"] = min(walls)
        row[f"ours_j{jobs}_cpu"] = statistics.median(cpus)
        row[f"floor_j{jobs}_s"] = statistics.median(floors)
        row[f"load_j{jobs}_lo"], row[f"load_j{jobs}_hi"] = min(loads[jobs]), max(loads[jobs])
    with tempfile.TemporaryDirectory() as tmp:
        msit = [
            str(args.msit / "bin" / "msit"),
            "llm",
            "compare",
            "-gp",
            str(golden),
            "-mp",
            str(target),
            "-cl",
            "api",
            "-o",
            tmp,
        ]
        walls, cpus, _ = timed(msit, env, args.msit_repeat)
        row["msit_s"] = statistics.median(walls)
        row["msit_min"] = min(walls)
        row["msit_cpu"] = statistics.median(cpus)
    row["load_end"] = os.getloadavg()[0]
    if args.layerwatch_format:
        lw_golden, lw_target = ensure_layerwatch_dumps(args.work, case)
        _, lw_bytes, _ = load_floor(lw_golden, lw_target, 1)
        lw = [
            sys.executable,
            "-m",
            "layerwatch.tui",
            "compare",
            str(lw_golden),
            str(lw_target),
            "--json",
            "--jobs",
            "1",
        ]
        timed(lw, env, 1)
        walls, cpus, _ = timed(lw, env, args.repeat)
        row["lw_MB"], row["lw_s"], row["lw_cpu"] = (
            lw_bytes / 1e6,
            statistics.median(walls),
            statistics.median(cpus),
        )
    return row


def report(case: str, row: dict[str, float], jobs: list[int]) -> None:
    mb, pairs = row["MB"], row["pairs"]
    print(f"\ncase ({case}): {CASES[case]}")
    print(
        f"  dumps: {mb:.1f} MB of payload in {int(row['tensors'])} tensors, {int(pairs)} pairs compared"
    )
    print(
        f"  load floor (read every payload once, in-process): {row['floor_s']:.3f} s = {mb / row['floor_s']:.0f} MB/s"
    )
    print(
        f"  whole-process floor (a fresh python imports numpy and our readers, reads every "
        f"payload once): {row['proc_floor_s']:.3f} s wall ({row['proc_floor_cpu']:.3f} s CPU); "
        f"python -c pass {row['python_s']:.3f} s, import numpy {row['numpy_s']:.3f} s → "
        f"no Python tool that reads the payloads beats msit by more than "
        f"{row['msit_s'] / row['proc_floor_s']:.0f}× by wall here"
    )
    print(f"  load average {row['load_start']:.1f} → {row['load_end']:.1f} while timing")
    print(
        f"  msit llm compare -cl api: {row['msit_s']:.2f} s wall (min {row['msit_min']:.2f}; "
        f"{row['msit_cpu']:.2f} s CPU) = {mb / row['msit_s']:.1f} MB/s, "
        f"{pairs / row['msit_s']:.0f} pairs/s"
    )
    for j in jobs:
        s, cpu, low = row[f"ours_j{j}_s"], row[f"ours_j{j}_cpu"], row[f"ours_j{j}_min"]
        print(
            f"  layerwatch compare --jobs {j}: {s:.2f} s wall (min {low:.2f}; {cpu:.2f} s CPU) = "
            f"{mb / s:.0f} MB/s, {pairs / s:.0f} pairs/s  → {row['msit_s'] / s:.1f}× msit by "
            f"wall (min/min {row['msit_min'] / low:.1f}×), {row['msit_cpu'] / cpu:.1f}× by CPU; "
            f"{row['floor_s'] / s:.0%} of the load floor; {row[f'floor_j{j}_s'] / s:.0%} of the "
            f"floor read alongside each run ({row[f'floor_j{j}_s']:.3f} s); load average "
            f"{row[f'load_j{j}_lo']:.1f}–{row[f'load_j{j}_hi']:.1f} at the runs' starts"
        )
        if f"before_j{j}_s" in row:
            b = row[f"before_j{j}_s"]
            print(
                f"    --before-python, alternating: {b:.2f} s wall "
                f"({row[f'before_j{j}_cpu']:.2f} s CPU) = {row['floor_s'] / b:.0%} of the load "
                f"floor, {row['msit_s'] / b:.1f}× msit; this build / it, medians of the "
                f"pairs' ratios: {row[f'ratio_j{j}_s']:.2f}× wall, "
                f"{row[f'ratio_j{j}_cpu']:.2f}× CPU"
            )
    print(
        f"  the same, --jobs 1 without the compiled kernel (LAYERWATCH_NO_NUMBA=1): "
        f"{row['numpy_j1_s']:.2f} s wall ({row['numpy_j1_cpu']:.2f} s CPU)"
    )
    print(
        f"  --jobs 1 reading the next payloads in a thread (LAYERWATCH_PREFETCH=1): "
        f"{row['ahead1_s']:.2f} s wall ({row['ahead1_cpu']:.2f} s CPU); in this thread only "
        f"(=0): {row['ahead0_s']:.2f} s wall ({row['ahead0_cpu']:.2f} s CPU) → "
        f"{row['ahead0_s'] / row['ahead1_s']:.2f}× by wall; by default the thread runs when "
        f"the load average is below cores − ½"
    )
    if "lw_s" in row:
        s, cpu = row["lw_s"], row["lw_cpu"]
        print(
            f"  same model dumped in the layerwatch format ({row['lw_MB']:.1f} MB, shared payloads), "
            f"--jobs 1: {s:.2f} s wall ({cpu:.2f} s CPU) → {row['msit_s'] / s:.1f}× msit by wall, "
            f"{row['msit_cpu'] / cpu:.1f}× by CPU"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--make", nargs=3, metavar=("CASE", "SIDE", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--tool", default="msit", help=argparse.SUPPRESS)
    parser.add_argument(
        "--no-layerwatch-format",
        dest="layerwatch_format",
        action="store_false",
        help="skip timing the same model dumped in our own format",
    )
    parser.add_argument("--cases", nargs="+", default=["a", "b"], choices=sorted(CASES))
    parser.add_argument(
        "--work", type=Path, default=Path(tempfile.gettempdir()) / "layerwatch-bench-compare"
    )
    parser.add_argument(
        "--msit",
        type=Path,
        default=None,
        help="msit side venv (default: WORK/msit-venv, built on first use: msit 8.2.0 + msit install llm)",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of ours and of the floor (median)"
    )
    parser.add_argument("--msit-repeat", type=int, default=3, help="runs of msit (median)")
    parser.add_argument(
        "--before-python",
        type=Path,
        default=None,
        help="another build's python (e.g. main's): its compare timed for each --jobs value, "
        "alternating with this build's, same dumps and load",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        nargs="+",
        default=[1, 0, 2],
        help="--jobs values to time (0 = the default: one process per idle core)",
    )
    args = parser.parse_args()
    if args.make:
        case, side, out = args.make
        make_dump(case, side, Path(out), args.tool)
        return
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"[bench] cores: {os.cpu_count()}, load average {load:.1f}, OMP_NUM_THREADS=1, "
        f"medians of {args.repeat} (msit: {args.msit_repeat})"
    )
    if args.msit is None:
        args.msit = ensure_msit_venv(args.work / "msit-venv")
    for case in args.cases:
        report(case, bench_case(case, args), args.jobs)


if __name__ == "__main__":
    main()
