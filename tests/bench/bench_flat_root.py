"""A 1-D root output compares as fast as a plain tensor of the same size (issue: quadratic carry).

    . .venv/bin/activate && OMP_NUM_THREADS=1 python tests/bench/bench_flat_root.py [--elems 64M]

Two real dumps per case, captured with ``register_hook`` from a two-module model whose child
scales its input and whose root returns that, golden fp32 vs a target with 1e-3 noise:
``flat`` — the child and the root return 1-D tensors of ``--elems`` elements; ``plain`` — the
same elements shaped ``[elems / 2^21, 2^21]`` (a last axis no vocabulary has: the plain-tensor
path). Each case compares two pairs of ``--elems`` elements. Both go through ``layerwatch compare`` in a fresh process. Before the fix a
1-D root output was read as one vocabulary row and its partial row was joined again for every
chunk (quadratic: 2^28 elements took over 10 minutes). Goal: flat ≤ 3× plain.
Also times ``row_blocks`` alone on a stream whose row is the whole tensor.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CAPTURE = r"""
import sys, torch
from layerwatch.capture.config import DumpConfig
from layerwatch.capture.hooks import register_hook
out, n, flat, noise = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "flat", float(sys.argv[4])
WIDE = 1 << 21  # a last axis beyond MAX_VOCAB in engine/numerics/logits.py: a plain tensor
class Scale(torch.nn.Module):
    def forward(self, x):
        return x * 2.0
class Root(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = Scale()
    def forward(self, x):
        return self.scale(x) + 0.0
shape = (n,) if flat else (n // WIDE, WIDE)
x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
x = x + noise * torch.randn(shape, generator=torch.Generator().manual_seed(1))
model = Root()
with register_hook(model, DumpConfig(dump_path=out)), torch.no_grad():
    model(x)
"""


def _size(text: str) -> int:
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(text[:-1] if scale > 1 else text) * scale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elems", type=_size, default=64 << 20)
    parser.add_argument("--work", default=None)
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="layerwatch-flat-root-"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    times = {}
    for case in ("plain", "flat"):
        dumps = []
        for side, noise in (("golden", 0.0), ("target", 1e-3)):
            out = work / case / side
            if not out.exists():
                subprocess.run(
                    [sys.executable, "-c", CAPTURE, str(out), str(args.elems), case, str(noise)],
                    check=True,
                    env=env,
                )
            dumps.append(out)
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "layerwatch.tui", "compare", *map(str, dumps), "--jobs", "1"],
            capture_output=True,
            text=True,
            env=env,
        )
        times[case] = time.perf_counter() - start
        last = done.stdout.strip().splitlines()[-1:] or [done.stderr.strip()]
        print(
            f"{case:5s} {args.elems:,} elements: {times[case]:.2f} s (exit {done.returncode}) {last[0]}"
        )
    print(f"flat / plain = {times['flat'] / times['plain']:.2f} (goal <= 3)")

    import numpy as np
    from layerwatch.engine.numerics.logits import row_blocks

    chunk = 1 << 20
    stream = np.zeros(chunk, np.float32)
    n = args.elems // chunk * chunk
    start = time.perf_counter()
    rows = sum(1 for _ in row_blocks(((stream, stream) for _ in range(n // chunk)), n))
    print(
        f"row_blocks, one row of {n:,} in {chunk:,}-element chunks: "
        f"{time.perf_counter() - start:.2f} s ({rows} row)"
    )


if __name__ == "__main__":
    main()
