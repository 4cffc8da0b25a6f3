"""``precheck --replay`` vs a full dump of the same run: disk and wall time.

    OMP_NUM_THREADS=1 python tests/bench/bench_replay.py [--tokens 8 32 128]

For each token count, three runs of tests/live/programs/hf_replay.py (the zoo's tiny Llama in
bf16, greedy generation, 12-token prompt) as a user runs them: the plain command,
``layerwatch precheck --replay -- CMD`` and ``layerwatch dump -- CMD``. Printed: the bytes
each leaves (replay: its ``replay_*.json``; dump: every file but the program's log), their
ratio, and the wall time of each. The figures in README come from this script.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROGRAM = Path(__file__).resolve().parents[1] / "live" / "programs" / "hf_replay.py"


def _run(*args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    res = subprocess.run(list(args), capture_output=True, text=True, check=False)
    if res.returncode not in (0, 1):
        sys.exit(f"{args}: exit {res.returncode}: {res.stderr[-400:]}")
    return time.perf_counter() - start, res


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, nargs="+", default=[8, 32, 128])
    opts = parser.parse_args()
    lw = [sys.executable, "-m", "layerwatch.tui"]
    print("tokens  replay_bytes  dump_bytes  ratio    plain_s  replay_s  dump_s")
    for tokens in opts.tokens:
        cmd = [sys.executable, str(PROGRAM), "benign", str(tokens)]
        with tempfile.TemporaryDirectory() as tmp:
            plain_s, _ = _run(*cmd)
            replay_s, res = _run(*lw, "precheck", "--replay", "--json", "--", *cmd)
            replay = json.loads(res.stdout)["replay"]["bytes"]
            dump_s, _ = _run(*lw, "dump", "--out", f"{tmp}/dump", "--", *cmd)
            full = sum(
                p.stat().st_size
                for p in Path(tmp, "dump").rglob("*")
                if p.is_file() and p.suffix != ".log"
            )
        print(
            f"{tokens:6d}  {replay:12d}  {full:10d}  {replay / full:6.2%}  "
            f"{plain_s:7.2f}  {replay_s:8.2f}  {dump_s:6.2f}"
        )


if __name__ == "__main__":
    main()
