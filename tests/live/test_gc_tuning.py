"""Garbage-collector tuning for the live front ends (``engine/live/gc_tuning.py``).

Freezing is process-wide, so every check runs in a fresh interpreter (never in pytest's own).
Pause lengths are measured by ``tests/bench/bench_gc.py``; here: what is frozen and what is
still freed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "msprobe"


def _run(script: str, *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


SETTLE = """
import gc, json, weakref
from layerwatch.engine.live.gc_tuning import HeapFreezer, settle

class Node:
    pass

def cycle():
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)

gc.disable()                      # nothing may collect the cycle but settle() itself
dead_cycle = cycle()
kept = Node()
kept_ref = weakref.ref(kept)
settle()
after_settle = {"cycle_freed": dead_cycle() is None, "frozen": gc.get_freeze_count(),
                "walked": len(gc.get_objects())}
del kept                          # frozen, but reference counting still frees it
after_settle["frozen_freed_by_refcount"] = kept_ref() is None

freezer = HeapFreezer(every_s=0)
young = [Node() for _ in range(1000)]
again = cycle()
freezer.tick()
after_tick = {"cycle_freed": again() is None, "walked": len(gc.get_objects()),
              "frozen_grew": gc.get_freeze_count() - after_settle["frozen"]}
print(json.dumps({"settle": after_settle, "tick": after_tick}))
"""


def test_settle_and_tick_collect_garbage_then_freeze_the_rest() -> None:
    seen = _run(SETTLE)
    settle, tick = seen["settle"], seen["tick"]
    assert settle["cycle_freed"], "garbage present before the freeze must be collected, not frozen"
    assert settle["frozen"] > 5_000  # the interpreter's start-up heap and our imports
    assert settle["walked"] < 1_000  # a collection now walks almost nothing
    assert settle["frozen_freed_by_refcount"]
    assert tick["cycle_freed"]
    assert tick["frozen_grew"] >= 1000  # the young objects moved to the permanent generation
    assert tick["walked"] < 1_000


PIPELINE = """
import gc, json, sys
from layerwatch.engine.live.pipeline import LivePipeline, attach_spec

def run(freeze):
    gc.unfreeze()
    pipeline = LivePipeline(attach_spec(sys.argv[1], idle_s=0, watch=False),
                            attach_spec(sys.argv[2], idle_s=0, watch=False))
    pipeline.freeze_heap = freeze
    pipeline.start()
    assert pipeline.wait(60)
    pipeline.stop()
    return {"frozen": gc.get_freeze_count(), "pairs": pipeline.session.summary.pairs}

print(json.dumps({"off": run(False), "on": run(True)}))
"""


def test_pipeline_freezes_only_when_the_front_end_asks() -> None:
    seen = _run(PIPELINE, str(FIXTURES / "stats_golden"), str(FIXTURES / "stats_target"))
    assert seen["off"]["frozen"] == 0  # a library user's process is left alone
    assert seen["on"]["frozen"] > 10_000
    assert seen["on"]["pairs"] == seen["off"]["pairs"] == 743


TRIM = """
import json, sys
import numpy as np
from layerwatch.engine.live.gc_tuning import HeapFreezer

def anon():
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) for l in fh if l.startswith("RssAnon")) * 1024

arrays = [np.ones(1024) for _ in range(40_000)]  # 8 KB each: glibc's heap, not mmap
del arrays[::2]                                    # freed between survivors: kept by the heap
before = anon()
HeapFreezer(every_s=0).tick()
print(json.dumps({"before": before, "after": anon()}))
"""


def test_the_freezer_gives_freed_heap_pages_back() -> None:
    """Survivors between freed blocks keep glibc's pages: the tick's ``malloc_trim`` returns
    them (a live session freeing each settled token's records grew RSS otherwise)."""
    if sys.platform != "linux" or not Path("/proc/self/status").exists():
        return
    from layerwatch.engine.live.gc_tuning import trim_heap

    if not trim_heap():  # not glibc: nothing to give back this way
        return
    got = _run(TRIM)
    freed = 20_000 * 8192
    assert got["before"] - got["after"] > freed // 2, got


BATCH = """
import gc, json, sys
from layerwatch.engine import runner
from layerwatch.engine.live.gc_tuning import BATCH_THRESHOLDS
from layerwatch.tui.cli import build_parser

args = build_parser().parse_args(
    ["compare", sys.argv[1], sys.argv[2], "-o", sys.argv[3], "--jobs", "1"])
gc.set_threshold(700, 10, 10)
inner, during = runner._compare_main, []

def watched(args):
    during.append(gc.get_threshold())
    try:
        return inner(args)
    finally:
        during.append(gc.get_threshold())

runner._compare_main = watched
code = runner.compare_main(args)
print(json.dumps({"code": code, "during": during, "after": gc.get_threshold(),
                  "batch": BATCH_THRESHOLDS}))
"""


def test_batch_collections_leave_thresholds_someone_else_changed() -> None:
    import gc

    from layerwatch.engine.live.gc_tuning import BATCH_THRESHOLDS, batch_collections

    before = gc.get_threshold()
    try:
        with batch_collections():
            assert gc.get_threshold() == BATCH_THRESHOLDS
        assert gc.get_threshold() == before
        with batch_collections():
            gc.set_threshold(123, 4, 5)
        assert gc.get_threshold() == (123, 4, 5)
    finally:
        gc.set_threshold(*before)


def test_a_live_sessions_collections_wait_for_its_freezer() -> None:
    """The headless live session's thresholds are put back too, and its young collections
    wait far longer than a compare's (its HeapFreezer collects once a second)."""
    import gc

    from layerwatch.engine.live.gc_tuning import (
        BATCH_THRESHOLDS,
        FROZEN_BATCH_THRESHOLDS,
        batch_collections,
    )

    assert FROZEN_BATCH_THRESHOLDS[0] > 10 * BATCH_THRESHOLDS[0]
    before = gc.get_threshold()
    try:
        with batch_collections(FROZEN_BATCH_THRESHOLDS):
            assert gc.get_threshold() == FROZEN_BATCH_THRESHOLDS
        assert gc.get_threshold() == before
        with batch_collections(FROZEN_BATCH_THRESHOLDS):
            gc.set_threshold(123, 4, 5)
        assert gc.get_threshold() == (123, 4, 5)
    finally:
        gc.set_threshold(*before)


HEADLESS = """
import gc, json, sys
from layerwatch.engine.live.gc_tuning import FROZEN_BATCH_THRESHOLDS
from layerwatch.tui import frontends
from layerwatch.tui.cli import main

gc.set_threshold(700, 10, 10)
inner, during, freezer = frontends.headless, [], []

def watched(pipeline, *args, **kwargs):
    during.append(gc.get_threshold())
    freezer.append(pipeline.freeze_heap)  # the thresholds count on its once-a-second collection
    return inner(pipeline, *args, **kwargs)

frontends.headless = watched
code = main(["open", sys.argv[1], sys.argv[2], "--headless", "-o", sys.argv[3]])
print(json.dumps({"code": code, "during": during, "after": gc.get_threshold(),
                  "batch": FROZEN_BATCH_THRESHOLDS,
                  "freezer": freezer}))
"""


@pytest.mark.parametrize(
    ("script", "calls"),
    [(BATCH, 2), (HEADLESS, 1)],  # compare: at its start and end; open --headless: at its start
    ids=["compare", "open-headless"],
)
def test_collects_less_often_and_puts_the_thresholds_back(
    tmp_path: Path, script: str, calls: int
) -> None:
    golden, target = FIXTURES / "tensor_golden", FIXTURES / "tensor_target"
    seen = _run(script, str(golden), str(target), str(tmp_path / "report.csv"))
    assert seen["code"] in (0, 1)
    assert seen["during"] == [seen["batch"]] * calls
    assert seen.get("freezer", [True]) == [True]
    assert seen["after"] == [700, 10, 10]
    assert (tmp_path / "report.csv").stat().st_size > 0
