"""``layerwatch allreduce`` throughput: MB of all-reduce inputs and outputs checked per second.

    OMP_NUM_THREADS=1 python tests/bench/bench_allreduce.py [--ranks 2] [--calls 32] [--mib 4]
        [--dtype float32|bfloat16] [--repeat 3]

Writes a synthetic TP dump (tests/support/tp_dumps.py) whose outputs are the true sums, then
times :func:`check_allreduce` against the floor of reading
the same bytes once (``load_array`` of every payload). Prints the median of each, MB/s and
their ratio as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from layerwatch.engine.allreduce import check_allreduce, read_ranks
from layerwatch.engine.readers.load import load_array

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.tp_dumps import write_allreduce_dump


def read_floor(root: Path) -> float:
    start = time.perf_counter()
    ranks, _, _ = read_ranks(root)
    for rank in ranks:
        for call in rank.calls.values():
            for loc in (call.inp, call.out):
                if loc is not None:
                    load_array(loc, as_float=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--calls", type=int, default=32)
    parser.add_argument("--mib", type=float, default=4.0, help="MiB per float32 tensor")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    elems = int(args.mib * (1 << 20)) // 4
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        nbytes = write_allreduce_dump(root, args.ranks, args.calls, elems, args.dtype)
        check_s, floor_s = [], []
        for _ in range(args.repeat):
            floor_s.append(read_floor(root))
            started = time.perf_counter()
            report = check_allreduce(root)
            check_s.append(time.perf_counter() - started)
            assert report.first_failure is None and len(report.rows) == args.ranks * args.calls
    check, floor = statistics.median(check_s), statistics.median(floor_s)
    mb = nbytes / 1e6
    print(
        json.dumps(
            {
                "ranks": args.ranks,
                "calls": args.calls,
                "dtype": args.dtype,
                "MB": round(mb, 1),
                "check_s": round(check, 3),
                "check_MB_per_s": round(mb / check, 1),
                "read_floor_s": round(floor, 3),
                "read_MB_per_s": round(mb / floor, 1),
                "check_over_read": round(check / floor, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
