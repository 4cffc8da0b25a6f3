"""A report's float text in bulk (``engine/floattext.py``): checks it against ``repr`` over many
random float64 bit patterns and values across decades, and times it against ``repr`` a value
at a time.

    . .venv/bin/activate && python tests/bench/bench_floattext.py [--check 10] [--decades 4]

``--check N``: N million random bit patterns (every pattern as likely: NaNs, subnormals, both
signs, every exponent), ``--decades M``: M million values of random mantissas at every power
of ten from 1e-12 to 1e20 with None between them; each a million at a time, each must equal
``repr`` (empty for None) cell for cell. Prints the mismatches (none expected), then CPU µs a
value of ``floattext.cells`` against ``[repr(v) for v in values]`` on a report-like mix
(values of 1e-9 to 1, a tenth None). tests/engine/test_floattext.py runs a million of each.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from layerwatch.engine import floattext


def _reference(values: list[object]) -> list[str]:
    return ["" if v is None else repr(v) for v in values]


def check(millions: int, decades: int, seed: int = 20) -> int:
    rng = np.random.default_rng(seed)
    bad = 0
    for i in range(millions):
        values = rng.integers(0, 2**64, 1_000_000, dtype=np.uint64).view(np.float64).tolist()
        got, want = floattext.cells(values), _reference(values)
        bad += sum(a != b for a, b in zip(got, want, strict=True))
        print(f"bit patterns {i + 1}M: {bad} differ", flush=True)
    for i in range(decades):
        arr = rng.uniform(1.0, 10.0, 1_000_000) * 10.0 ** rng.integers(-12, 21, 1_000_000)
        arr *= rng.choice([-1.0, 1.0], 1_000_000)
        arr[::7] = np.round(arr[::7], 3)
        values: list[object] = arr.tolist()
        values[::11] = [None] * len(values[::11])
        got, want = floattext.cells(values), _reference(values)
        bad += sum(a != b for a, b in zip(got, want, strict=True))
        print(f"decades {i + 1}M: {bad} differ", flush=True)
    return bad


def speed(n: int = 60_000, repeat: int = 7) -> None:
    rng = np.random.default_rng(1)
    arr = rng.uniform(0.0, 1.0, n) * 10.0 ** rng.integers(-9, 1, n)
    values: list[object] = arr.tolist()
    values[::10] = [None] * len(values[::10])
    best = {"cells": 1e9, "repr": 1e9}
    for _ in range(repeat):
        t = time.process_time()
        floattext.cells(values)
        best["cells"] = min(best["cells"], time.process_time() - t)
        t = time.process_time()
        _reference(values)
        best["repr"] = min(best["repr"], time.process_time() - t)
    print(
        f"CPU µs a value (min of {repeat}): cells {best['cells'] / n * 1e6:.3f}, "
        f"repr {best['repr'] / n * 1e6:.3f} ({best['repr'] / best['cells']:.1f}x)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", type=int, default=10, help="millions of random bit patterns")
    ap.add_argument("--decades", type=int, default=4, help="millions of values across decades")
    args = ap.parse_args()
    bad = check(args.check, args.decades)
    speed()
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
