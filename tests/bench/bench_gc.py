"""Garbage-collector pauses of the engine thread while a session grows to ~10⁵ pairs.

    OMP_NUM_THREADS=1 python tests/bench/bench_gc.py [--pairs 100000] [--modes default tuned] [--repeat 3]

Each mode runs in a fresh process: a real :class:`CompareSession` is fed small real tensors
(16 float32 values at offsets in one data file per run, as the layerwatch writer stores them)
one token at a time — add both runs' records, ``flush()`` — the way the live worker does.
Measured: every collection's duration per generation (``gc.callbacks``), and the longest
stall seen by a second thread that sleeps 2 ms in a loop (what the TUI's thread feels: a
collection holds the GIL). Modes:

- ``default``: CPython's thresholds (700, 10, 10);
- ``startup``: ``gc.freeze()`` once after the imports;
- ``threshold``: ``gc.set_threshold(50_000, 20, 100)`` only;
- ``tuned``: what the live front ends do (``LivePipeline.freeze_heap``, :mod:`layerwatch.engine.live.gc_tuning`):
  ``settle()`` after start-up, then ``HeapFreezer.tick()`` after each flush (a collection of
  what is new and a freeze, at most once a second).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

NODES_PER_TOKEN = 500
STEMS = ("input_0", "output")
ELEMS = 16


def child(mode: str, pairs: int, workdir: Path) -> dict[str, object]:
    import numpy as np
    from layerwatch.engine.records import Locator, TensorKey, TensorRecord
    from layerwatch.engine.session.core import CompareSession

    if mode == "startup":
        gc.freeze()
    elif mode == "threshold":
        gc.set_threshold(50_000, 20, 100)
    freezer = None
    if mode == "tuned":
        from layerwatch.engine.live.gc_tuning import HeapFreezer, settle

        settle()
        freezer = HeapFreezer()

    per_token = NODES_PER_TOKEN * len(STEMS)
    tokens = max(1, pairs // per_token)
    rng = np.random.default_rng(0)
    files = {}
    for side, noise in (("golden", 0.0), ("target", 1e-4)):
        data = rng.standard_normal((tokens * per_token, ELEMS)).astype(np.float32)
        data += noise * rng.standard_normal(data.shape).astype(np.float32)
        path = workdir / f"{side}.bin"
        data.tofile(path)
        files[side] = str(path)

    pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
    started = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses[info["generation"]].append(time.perf_counter() - started[0])

    stall = [0.0]
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            before = time.perf_counter()
            time.sleep(0.002)
            stall[0] = max(stall[0], time.perf_counter() - before - 0.002)

    session = CompareSession(jobs=1)
    gc.callbacks.append(on_gc)
    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    start = time.perf_counter()
    nbytes = ELEMS * 4
    for token in range(tokens):
        for side in ("golden", "target"):
            records = []
            for i in range(per_token):
                node = f"root.model.layers.{i // 20}.mlp.op{i % 20 // 2}"
                key = TensorKey(token, node, STEMS[i % 2], 0)
                offset = (token * per_token + i) * nbytes
                loc = Locator(files[side], offset, nbytes, "float32", (1, ELEMS))
                records.append(
                    TensorRecord(key, "float32", (1, ELEMS), loc, order=i // 2, source=files[side])
                )
            session.add_records(side, records)
        session.flush()
        if freezer is not None:
            freezer.tick()
    elapsed = time.perf_counter() - start
    stop.set()
    thread.join()
    gc.callbacks.remove(on_gc)
    summary = session.summary
    return {
        "mode": mode,
        "pairs": summary.pairs,
        "seconds": elapsed,
        "stall_max": stall[0],
        "gen2": len(pauses[2]),
        "gen2_max": max(pauses[2], default=0.0),
        "gen2_total": sum(pauses[2]),
        "young_total": sum(pauses[0]) + sum(pauses[1]),
        "young_max": max(pauses[0] + pauses[1], default=0.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=100_000)
    parser.add_argument("--modes", nargs="+", default=["default", "startup", "threshold", "tuned"])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(child(args.child, args.pairs, Path(tmp))))
        return
    rows: dict[str, list[dict[str, float]]] = {m: [] for m in args.modes}
    for _ in range(args.repeat):
        for mode in args.modes:  # interleaved, fresh processes
            out = subprocess.run(
                [sys.executable, __file__, "--child", mode, "--pairs", str(args.pairs)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            rows[mode].append(json.loads(out.stdout.splitlines()[-1]))
    print(f"{args.pairs} pairs fed one token ({NODES_PER_TOKEN * len(STEMS)} pairs) per flush; "
          f"medians of {args.repeat}")  # fmt: skip
    print(f"{'mode':10} {'wall s':>7} {'stall max ms':>13} {'gen2 n':>7} {'gen2 max ms':>12} "
          f"{'gen2 total ms':>14} {'young total ms':>15} {'young max ms':>13}")  # fmt: skip
    base = None
    for mode, runs in rows.items():

        def med(field: str, runs: list[dict[str, float]] = runs) -> float:
            return statistics.median(r[field] for r in runs)

        if base is None:
            base = med("stall_max")
        print(
            f"{mode:10} {med('seconds'):7.2f} {med('stall_max') * 1e3:13.1f} {med('gen2'):7.0f} "
            f"{med('gen2_max') * 1e3:12.1f} {med('gen2_total') * 1e3:14.1f} "
            f"{med('young_total') * 1e3:15.1f} {med('young_max') * 1e3:13.1f}"
            f"   stall ratio vs {args.modes[0]}: {med('stall_max') / base:.2f}"
        )


if __name__ == "__main__":
    main()
