"""Stopping launched commands leaves no process behind: the group, grandchildren, processes
that ignore SIGTERM and grandchildren that left the group (setsid)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from layerwatch.capture.launch import Child, LaunchSpec
from live.helpers import env_with, is_running

FAMILY = """
trap '' TERM INT HUP
sleep 1000 & echo $! >> {pids}
(trap '' TERM; exec sleep 1001) & echo $! >> {pids}
setsid sleep 1002 & echo $! >> {pids}
{python} -c "import time; time.sleep(1000)" & echo $! >> {pids}
echo $$ >> {pids}
echo ready
wait
"""
"""A shell that ignores the polite signals, with four children: plain, TERM-deaf, in its own
session (out of the process group), and a Python process."""


def _family(tmp_path: Path) -> tuple[str, Path]:
    pids = tmp_path / "pids"
    return FAMILY.format(pids=pids, python=sys.executable), pids


def _wait_pids(pids: Path, n: int = 5, timeout: float = 20) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pids.exists() and len(pids.read_text().split()) >= n:
            return [int(p) for p in pids.read_text().split()]
        time.sleep(0.02)
    raise AssertionError("the family did not start")


def test_stop_kills_group_and_escaped_descendants(tmp_path: Path) -> None:
    script, pids = _family(tmp_path)
    child = Child(LaunchSpec(cmd=["/bin/sh", "-c", script], out=tmp_path / "d"))
    child.start()
    family = _wait_pids(pids)
    assert all(is_running(p) for p in family)
    started = time.monotonic()
    child.stop(signal.SIGTERM, grace=1.0)
    took = time.monotonic() - started
    assert [p for p in family if is_running(p)] == []
    assert 0.9 <= took < 8, took  # waited the grace period for the TERM-deaf, then SIGKILL
    assert child.exit_code == 128 + signal.SIGKILL
    assert "killed by SIGKILL" in child.describe() and "out of memory" not in child.describe()
    child.stop()  # idempotent


def test_sigterm_to_layerwatch_dump_leaves_no_orphans(tmp_path: Path) -> None:
    script, pids = _family(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "layerwatch.tui", "dump", "--out", str(tmp_path / "d"), "--shell", "--", script],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_with(LAYERWATCH_GRACE="1"),
    )  # fmt: skip
    try:
        family = _wait_pids(pids)
        proc.send_signal(signal.SIGTERM)
        stdout, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert [p for p in family if is_running(p)] == []
    assert proc.returncode == 128 + signal.SIGKILL
    assert "killed by SIGKILL" in stdout


def test_child_that_obeys_sigterm_is_not_killed(tmp_path: Path) -> None:
    child = Child(
        LaunchSpec(
            cmd=[sys.executable, "-c", "import time; print('up', flush=True); time.sleep(100)"],
            out=tmp_path / "d",
        )
    )
    child.start()
    deadline = time.monotonic() + 20
    while "up" not in child.log_tail() and time.monotonic() < deadline:
        time.sleep(0.02)
    child.stop(signal.SIGTERM, grace=10)
    assert child.exit_code == 128 + signal.SIGTERM
    assert child.describe() == "killed by SIGTERM"
