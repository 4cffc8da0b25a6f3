"""What per-case capture adds to dump time: the demo model, N cases × T tokens, with and
without ``case()`` around each prompt.

    OMP_NUM_THREADS=1 python tests/bench/bench_cases.py [--cases 20] [--tokens 32] [--repeat 3]

Each repeat times both variants back to back (order alternating), each from
``register_hook`` to ``close()`` (everything on disk), and prints the median of each and their
ratio as one JSON line. Per case the capture writes two index lines; everything else is equal.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

from layerwatch.capture import DumpConfig, case, register_hook
from layerwatch.capture.demo import build_model, generate, make_prompt


def run(cases: int, tokens: int, cased: bool) -> float:
    model = build_model()
    prompts = [make_prompt(8, seed=i) for i in range(cases)]
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        with register_hook(model, DumpConfig(dump_path=out)):
            for i, prompt in enumerate(prompts):
                if cased:
                    with case(i):
                        generate(model, prompt, tokens)
                else:
                    generate(model, prompt, tokens)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    times: dict[bool, list[float]] = {False: [], True: []}
    run(2, 2, True)  # warm-up: imports, first allocations
    for r in range(args.repeat):
        for cased in (r % 2 == 0, r % 2 != 0):
            times[cased].append(run(args.cases, args.tokens, cased))
    plain, cased = statistics.median(times[False]), statistics.median(times[True])
    print(json.dumps({"cases": args.cases, "tokens": args.tokens, "plain_s": round(plain, 3),
                      "cased_s": round(cased, 3), "ratio": round(cased / plain, 4)}))  # fmt: skip


if __name__ == "__main__":
    main()
