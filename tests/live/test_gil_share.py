"""The worker's GIL sharing for a front end's UI thread (``engine/live/gil_share.py``).

The settings are process-wide, so every check runs in a fresh interpreter. What a shorter
switch interval buys in key latency is measured by ``tests/bench/bench_scale.py --tui``; here:
the settings hold while the worker loads, and are put back when it ends.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "msprobe"

PIPELINE = """
import gc, json, sys
from layerwatch.engine.live.gil_share import NO_AUTO_FULL, SWITCH_S
from layerwatch.engine.live.pipeline import LivePipeline, attach_spec
from layerwatch.engine.seam import QueueSink

class Seen(QueueSink):
    '''Each batch the worker sends, with the settings the worker ran under then.'''
    def __init__(self):
        super().__init__()
        self.settings = []
    def on_batch(self, batch):
        self.settings.append([sys.getswitchinterval(), gc.get_threshold()[2]])
        super().on_batch(batch)

def run(share, freeze):
    pipeline = LivePipeline(attach_spec(sys.argv[1], idle_s=0, watch=False),
                            attach_spec(sys.argv[2], idle_s=0, watch=False))
    pipeline.sink = seen = Seen()
    pipeline.share_gil, pipeline.freeze_heap = share, freeze
    pipeline.start()
    assert pipeline.wait(60)
    after = [sys.getswitchinterval(), gc.get_threshold()[2]]
    pipeline.stop()
    return {"during": seen.settings, "after": after, "pairs": pipeline.session.summary.pairs}

before = [sys.getswitchinterval(), gc.get_threshold()[2]]
print(json.dumps({"before": before, "switch": SWITCH_S, "no_full": NO_AUTO_FULL,
                  "off": run(False, True), "on": run(True, True),
                  "unfrozen": run(True, False)}))
"""


def _run(script: str, *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_worker_shares_the_gil_only_while_it_runs_and_only_when_asked() -> None:
    seen = _run(PIPELINE, str(FIXTURES / "stats_golden"), str(FIXTURES / "stats_target"))
    before, switch, no_full = seen["before"], seen["switch"], seen["no_full"]
    assert before[0] > switch and before[1] < no_full  # CPython's defaults differ from ours
    on = seen["on"]
    assert on["pairs"] == seen["off"]["pairs"] == 743
    assert len(on["during"]) >= 2  # the first batch and the last, at least
    # every batch was sent under the short interval, full collections left to the freezer
    assert all(s == [switch, no_full] for s in on["during"]), on["during"]
    assert on["after"] == before  # put back once the worker ended, before ``done``
    # a library user's process (no front end asked) is left as it was
    assert all(s == before for s in seen["off"]["during"])
    assert seen["off"]["after"] == before
    # without the freezer's collections the automatic ones stay
    unfrozen = seen["unfrozen"]
    assert all(s == [switch, before[1]] for s in unfrozen["during"]), unfrozen["during"]
    assert unfrozen["after"] == before
