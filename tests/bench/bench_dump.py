"""Dump overhead: generate time with full capture (until every tensor is on disk) / without.

Run (from the repository root, in the project venv)::

    OMP_NUM_THREADS=1 python tests/bench/bench_dump.py            # configs a and b, 5 repeats
    OMP_NUM_THREADS=1 python tests/bench/bench_dump.py --config b --repeats 9
    OMP_NUM_THREADS=1 python tests/bench/bench_dump.py --msit-python VENV/bin/python
    OMP_NUM_THREADS=1 python tests/bench/bench_dump.py --config long --repeats 3
    OMP_NUM_THREADS=1 python tests/bench/bench_dump.py --cli --repeats 5 [--before-python B/bin/python]
        [--also thread=W]   # W: a wrapper running this venv's python with LAYERWATCH_WRITER=thread

Both sides run a Hugging Face ``LlamaForCausalLM`` (eager attention) built from a ``LlamaConfig``
with ``torch.manual_seed(1234)`` and greedy ``generate`` on fixed random prompt ids, as msit 8.2.0
was measured: (a) hidden 1024, 8 layers, 16 heads, vocab 32000, prompt 256, 4 new
tokens: 1.22 s -> 2.38 s (1.95x); (b) hidden 256, 4 layers, 4 heads, vocab 1000, prompt 16,
8 new tokens: 0.06 s -> 0.45 s (7x). Goals: (a) <= 1.3x, (b) <= 2x.

(long) a long generation of a tiny model: hidden 64, 4 layers, 4 heads, vocab 256, prompt 16,
512 new tokens (156 tensors a token, 79 872 in all: the small-tensor path). Goal <= 1.25x.

``--cli`` times the (long) case the way a user runs it: an unmodified script, whole process
wall time, ``python script.py`` against ``layerwatch dump --out D -- python script.py``
(interleaved; median and min of ``--repeats``); the script also prints its own ``generate`` time, so
both the whole-run and the generate-only ratios are shown. ``--before-python`` names the
python of another checkout's venv (e.g. main's): its ``layerwatch dump`` runs interleaved
with ours, so a before/after pair comes from one run under one load. It must be a venv that
imports that checkout by itself (an editable install): a ``PYTHONPATH`` shim does not reach the
dumped script, which then captures nothing; a side that dumped no tensor stops the bench.

Baseline and captured runs alternate in one process; each figure is the median of
``--repeats`` runs; a captured run is ``generate`` + ``HookHandle.close()`` (everything on disk,
end records written). Registration (topology, parameter fingerprints) is timed separately.
Also printed: the median of the per-run ratios (robust to load drifting on a shared machine)
and the ratio of process CPU time (model and writer threads together: the work, not the wait).
When ``--msit-python`` points at a venv with msit installed (default: the side venv that
``tests/bench/bench_compare.py`` builds under its work dir, if it exists), msit's own ``DumpConfig``/``register_hook`` runs on the same config in a subprocess and
its ratio is printed beside ours.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = {
    "a": dict(hidden=1024, layers=8, heads=16, vocab=32000, prompt=256, new=4, inter=2816),
    "b": dict(hidden=256, layers=4, heads=4, vocab=1000, prompt=16, new=8, inter=688),
    "long": dict(hidden=64, layers=4, heads=4, vocab=256, prompt=16, new=512, inter=176),
}
MSIT_SIDE = (
    Path(tempfile.gettempdir()) / "layerwatch-bench-compare" / "msit-venv" / "bin" / "python"
)
"""msit's side venv as ``tests/bench/bench_compare.py`` builds it (default ``--work``)."""

_MODEL_CODE = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM

def build(c):
    torch.manual_seed(1234)
    cfg = LlamaConfig(hidden_size=c["hidden"], intermediate_size=c["inter"],
                      num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
                      num_key_value_heads=c["heads"], vocab_size=c["vocab"],
                      max_position_embeddings=2048, attn_implementation="eager")
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, c["vocab"], (1, c["prompt"]), generator=torch.Generator().manual_seed(7))
    return model, ids

def generate(model, ids, c):
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=c["new"],
                              min_new_tokens=c["new"], do_sample=False, pad_token_id=0)
"""

_MSIT_CODE = (
    _MODEL_CODE
    + """
import json, sys, time, statistics
c = json.loads(sys.argv[1]); repeats = int(sys.argv[2]); out = sys.argv[3]
torch.set_num_threads(1)
model, ids = build(c)
generate(model, ids, c)
base = []
for _ in range(repeats):
    t = time.perf_counter(); generate(model, ids, c); base.append(time.perf_counter() - t)
from msit_llm import DumpConfig, register_hook
# every token of every dumped run (msit checks `token in list`: keep the list short)
register_hook(model, DumpConfig(dump_path=out, token_range=list(range(repeats * c["new"] + 1))))
dump = []
for _ in range(repeats):
    t = time.perf_counter(); generate(model, ids, c); dump.append(time.perf_counter() - t)
print(json.dumps({"base": statistics.median(base), "dump": statistics.median(dump)}))
"""
)


_SCRIPT = (
    _MODEL_CODE
    + """
import json, sys, time
c = json.loads(sys.argv[1])
torch.set_num_threads(1)
model, ids = build(c)
t = time.perf_counter()
generate(model, ids, c)
print("GENERATE", time.perf_counter() - t)
"""
)
"""The unmodified user script of ``--cli``: builds the model, one ``generate``, prints its time."""


def _cli_run(python: str, script: Path, c: dict, out: Path | None) -> tuple[float, float, float]:
    """(whole-process wall seconds, the script's own generate seconds, CPU seconds of every
    process of the run: less sensitive to a loaded machine than wall time) of one run."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [python, str(script), json.dumps(c)]
    if out is not None:
        cli = "import sys; from layerwatch.tui.cli import main; sys.exit(main())"
        cmd = [python, "-c", cli, "dump", "--out", str(out), "--", *cmd]
    t = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    text = proc.stdout
    if out is not None:  # the child's output goes to the dump's log
        log = out / "layerwatch.log"
        text += log.read_text(errors="replace") if log.exists() else ""
    found = [ln for ln in text.splitlines() if ln.startswith("GENERATE")]
    if proc.returncode != 0 or not found:
        raise SystemExit(f"run failed ({proc.returncode}): {(proc.stderr or text)[-400:]}")
    return wall, float(found[-1].split()[1]), cpu


def bench_cli(
    c: dict, repeats: int, before: str | None, also: dict[str, str] | None = None
) -> dict[str, tuple[float, ...]]:
    """Median (wall, generate, CPU) and tensors dumped per side: ``plain``, ``dump`` (this checkout),
    ``before``, and each of ``also`` (label -> python)."""
    sides: dict[str, str | None] = {"plain": sys.executable, "dump": sys.executable}
    if before:
        sides["before"] = before
    sides.update(also or {})
    runs: dict[str, list[tuple[float, float, float]]] = {k: [] for k in sides}
    tensors: dict[str, int] = {}
    work = Path(tempfile.mkdtemp(prefix="bench_dump_cli_"))
    script = work / "tiny_llama_generate.py"
    script.write_text(_SCRIPT)
    try:
        for _ in range(repeats):
            for side, python in sides.items():
                out = None if side == "plain" else work / f"dump_{side}"
                runs[side].append(_cli_run(python, script, c, out))  # type: ignore[arg-type]
                if out is not None:
                    index = b"".join(p.read_bytes() for p in out.glob("*/index.jsonl"))
                    tensors[side] = index.count(b'{"k":"t",')
                    shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    empty = [side for side in sides if side != "plain" and not tensors.get(side)]
    if empty:  # a ratio against a run that captured nothing says nothing
        raise SystemExit(
            f"no tensor dumped by: {', '.join(empty)} (does its python import layerwatch?)"
        )
    out: dict[str, tuple[float, ...]] = {}
    for k, v in runs.items():
        out[k] = (
            statistics.median(r[0] for r in v),
            statistics.median(r[1] for r in v),
            statistics.median(r[2] for r in v),
            tensors.get(k, 0),
        )
        out[k + ":min"] = (min(r[0] for r in v), min(r[1] for r in v), min(r[2] for r in v), 0)
    return out


def _dir_size(path: Path) -> tuple[int, int]:
    files = [p for p in path.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def bench_ours(name: str, c: dict, repeats: int, fmt: str) -> dict:
    import torch
    from layerwatch.capture import DumpConfig, register_hook

    scope: dict = {}
    exec(_MODEL_CODE, scope)  # the same model code msit's subprocess runs
    torch.set_num_threads(1)
    model, ids = scope["build"](c)
    generate = scope["generate"]
    generate(model, ids, c)  # warm-up
    base, dump, reg, pairs, cpu_base, cpu_dump = [], [], [], [], [], []
    files = nbytes = 0
    for _ in range(repeats):
        t, p = time.perf_counter(), time.process_time()
        generate(model, ids, c)
        base.append(time.perf_counter() - t)
        cpu_base.append(time.process_time() - p)
        out = Path(tempfile.mkdtemp(prefix=f"bench_dump_{name}_"))
        try:
            t = time.perf_counter()
            handle = register_hook(model, DumpConfig(dump_path=out, format=fmt))
            reg.append(time.perf_counter() - t)
            t, p = time.perf_counter(), time.process_time()
            generate(model, ids, c)
            handle.close()
            dump.append(time.perf_counter() - t)
            cpu_dump.append(time.process_time() - p)
            pairs.append(dump[-1] / base[-1])
            assert handle.failed is None, handle.failed
            files, nbytes = _dir_size(out)
        finally:
            shutil.rmtree(out, ignore_errors=True)
    return {
        "base": statistics.median(base),
        "dump": statistics.median(dump),
        "pair": statistics.median(pairs),
        "register": statistics.median(reg),
        "cpu": statistics.median(cpu_dump) / statistics.median(cpu_base),
        "files": files,
        "bytes": nbytes,
    }


def bench_latency(c: dict, repeats: int) -> float:
    """Seconds from the end of ``generate`` (its last token) until that token's logits line is
    in ``index.jsonl``, without calling ``flush``/``close``: what a live viewer waits."""
    import torch
    from layerwatch.capture import DumpConfig, register_hook

    scope: dict = {}
    exec(_MODEL_CODE, scope)
    model, ids = scope["build"](c)
    waits = []
    for _ in range(repeats):
        out = Path(tempfile.mkdtemp(prefix="bench_dump_latency_"))
        try:
            handle = register_hook(model, DumpConfig(dump_path=out))
            with torch.no_grad():
                scope["generate"](model, ids, c)
            done = time.perf_counter()
            needle = f'"token":{c["new"] - 1},"node":"root.lm_head"'.encode()
            index = handle.run_dir / "index.jsonl"
            while needle not in index.read_bytes():
                time.sleep(0.001)
            waits.append(time.perf_counter() - done)
            handle.close()
        finally:
            shutil.rmtree(out, ignore_errors=True)
    return statistics.median(waits)


def bench_msit(python: Path, c: dict, repeats: int) -> dict | None:
    out = Path(tempfile.mkdtemp(prefix="bench_dump_msit_"))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    try:
        proc = subprocess.run(
            [str(python), "-c", _MSIT_CODE, json.dumps(c), str(repeats), str(out)],
            capture_output=True,
            text=True,
            env=env,
            timeout=1800,
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
            print(f"  msit run failed: {tail}", file=sys.stderr)
            return None
        return json.loads(lines[-1])
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=("a", "b", "long", "both"), default="both")
    parser.add_argument(
        "--cli",
        action="store_true",
        help="the long case as whole processes: python script.py vs layerwatch dump -- ...",
    )
    parser.add_argument(
        "--before-python",
        default="",
        help="with --cli: python of another checkout's venv, its layerwatch dump timed alongside",
    )
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="LABEL=PYTHON",
        help="with --cli: one more side, alternated with the others (e.g. a wrapper that runs "
        "this checkout's python with LAYERWATCH_WRITER=thread); repeatable",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--format", choices=("layerwatch", "msit"), default="layerwatch")
    parser.add_argument(
        "--msit-python",
        default=str(MSIT_SIDE) if MSIT_SIDE.exists() else "",
        help="python of a venv with msit installed ('' = skip msit)",
    )
    args = parser.parse_args()
    args.msit_python = Path(args.msit_python) if args.msit_python else None
    names = ("a", "b") if args.config == "both" else (args.config,)
    print(
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, repeats={args.repeats}, "
        f"format={args.format}, load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    )
    if args.cli:
        c = CONFIGS["long"]
        also = dict(a.split("=", 1) for a in args.also)
        res = bench_cli(c, args.repeats, args.before_python or None, also)
        labels = {"before": "layerwatch dump (before)", "dump": "layerwatch dump"}
        labels.update({k: f"layerwatch dump ({k})" for k in also})
        wall0, gen0, cpu0, _ = res["plain"]
        print(f"config long {c}, whole processes (median wall / the script's generate time)")
        print(f"  python script.py: {wall0:.2f} s (generate {gen0:.2f} s, CPU {cpu0:.2f} s)")
        for side, label in labels.items():
            if side in res:
                wall, gen, cpu, count = res[side]
                extra = (wall - wall0) / max(count, 1) * 1e6
                print(
                    f"  {label}: {wall:.2f} s = {wall / wall0:.2f}x whole run "
                    f"(generate {gen:.2f} s = {gen / gen0:.2f}x; CPU {cpu / cpu0:.2f}x; "
                    f"{count} tensors, {extra:.1f} us each)"
                )
        mins = {k[:-4]: v for k, v in res.items() if k.endswith(":min")}
        wall0, gen0, cpu0, _ = mins["plain"]
        print(
            f"  min of {args.repeats} (least disturbed by other load): python script.py "
            f"{wall0:.2f} s (generate {gen0:.2f} s, CPU {cpu0:.2f} s)"
        )
        for side in labels:
            if side in mins:
                wall, gen, cpu, _ = mins[side]
                print(
                    f"    {side}: {wall:.2f} s = {wall / wall0:.2f}x whole run (generate "
                    f"{gen:.2f} s = {gen / gen0:.2f}x; CPU {cpu / cpu0:.2f}x)"
                )
        print(f"  load average after: {os.getloadavg()[0]:.2f}")
        return 0
    for name in names:
        c = CONFIGS[name]
        ours = bench_ours(name, c, args.repeats, args.format)
        print(f"config {name} {c}")
        print(
            f"  layerwatch: {ours['base']:.3f} s -> {ours['dump']:.3f} s = "
            f"{ours['dump'] / ours['base']:.2f}x (median of per-run ratios {ours['pair']:.2f}x, "
            f"process CPU {ours['cpu']:.2f}x; {ours['files']} files, "
            f"{ours['bytes'] / 1e6:.1f} MB; register_hook {ours['register']:.3f} s)"
        )
        if name == "b":
            print(
                f"  live latency (last token ends -> its lines in index.jsonl): "
                f"{bench_latency(c, args.repeats) * 1e3:.0f} ms (median)"
            )
        if args.msit_python is not None:
            theirs = bench_msit(args.msit_python, c, args.repeats)
            if theirs:
                print(
                    f"  msit 8.2.0: {theirs['base']:.3f} s -> {theirs['dump']:.3f} s = "
                    f"{theirs['dump'] / theirs['base']:.2f}x"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
