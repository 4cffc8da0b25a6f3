"""The engine worker failing for real: the pipeline still ends, once, with one line.

The failure is made by the operating system, not by patching: with ``--jobs 2`` and the
msprobe statistics fixture (743 small pairs, enough for the process pool), a file-descriptor
limit of 10 (``ulimit -n 10``, as on a locked-down cluster node) lets the dumps be read but
makes starting the pool fail inside ``session.flush()`` (``OSError: Too many open files``).
If the session ever falls back to inline comparisons when its pool cannot start, these tests
need another real failure inside the worker.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

from live.helpers import layerwatch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "msprobe"
GOLDEN, TARGET = FIXTURES / "stats_golden", FIXTURES / "stats_target"
FD_LIMIT = 10


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


WORKER = f"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, ({FD_LIMIT}, {FD_LIMIT}))
from layerwatch.engine.live import LivePipeline, attach_spec
from layerwatch.engine.session import CompareSession

pipeline = LivePipeline(
    attach_spec(sys.argv[1], idle_s=0, watch=False),
    attach_spec(sys.argv[2], idle_s=0, watch=False),
    session=CompareSession(jobs=2),
)
pipeline.start()
finished = pipeline.wait(60)
pipeline.stop()
batches = pipeline.sink.drain()
print(json.dumps({{
    "finished": finished,
    "error": pipeline.error,
    "done": [b.done for b in batches],
    "notes": [n for b in batches for n in b.notes],
    "tensors": pipeline.session.progress(),
}}))
"""


def test_worker_failure_ends_with_a_done_batch_and_a_note() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", WORKER, str(GOLDEN), str(TARGET)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["finished"], "the worker never said it was done: a front end would wait forever"
    assert seen["error"].startswith("live pipeline stopped: "), seen
    assert "\n" not in seen["error"]
    assert seen["done"][-1] is True and seen["done"].count(True) == 1, seen["done"]
    assert seen["error"] in seen["notes"]
    # Both dumps were read before the comparison failed: what landed is still reported.
    assert seen["tensors"] == {"golden": [2, 743], "target": [2, 743]}


def test_headless_open_exits_2_with_the_workers_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "layerwatch.tui", "open", "--headless", "--jobs", "2",
         str(GOLDEN), str(TARGET)],
        capture_output=True, text=True, timeout=120, preexec_fn=_low_fd_limit,
    )  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert lines[-1].startswith("layerwatch open: live pipeline stopped: "), proc.stderr
    assert "Traceback" not in proc.stderr
    assert "nothing to compare" not in proc.stderr  # the real reason, not a misleading one
    assert sum("live pipeline stopped" in line for line in lines) == 1, proc.stderr
    assert proc.stdout == ""


def test_without_the_limit_the_same_open_compares() -> None:
    """The control: the same command with the usual limit compares every pair."""
    proc = layerwatch("open", "--headless", "--jobs", "2", str(GOLDEN), str(TARGET))
    assert proc.returncode in (0, 1), proc.stderr
    assert "pairs: 743 compared" in proc.stdout, proc.stdout
