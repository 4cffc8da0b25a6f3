"""``layerwatch demo`` in a real terminal: a private tmux server, real keys, the pane read back.

The demo launches the demo model twice (golden fp32, target with the kv_cache fault from
token 5) through live capture; the test waits for the first failure in the status line,
drills into the block and back, opens help, and quits with ``q`` (exit 0: the demo found its
planted fault). Polls instead of sleeping; generous timeouts for a 2-core CI machine.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.broken_dumps import truncated_weight_dumps

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]


class Pane:
    def __init__(self, server: str) -> None:
        self.server = server

    def tmux(self, *args: str) -> str:
        out = subprocess.run(
            ["tmux", "-L", self.server, *args], capture_output=True, text=True, timeout=20
        )
        return out.stdout

    def text(self, colours: bool = False) -> str:
        return self.tmux("capture-pane", "-p", *(["-e"] if colours else []), "-t", "app")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "app", *keys)

    def wait_for(self, *needles: str, timeout: float = 90.0) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.text()
            if all(n in screen for n in needles):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"{needles} not on screen after {timeout}s:\n{screen}")

    def wait_gone(self, needle: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while needle in self.text():
            if time.monotonic() > deadline:
                raise AssertionError(f"{needle!r} still on screen after {timeout}s")
            time.sleep(0.2)


_servers = itertools.count()  # one tmux server name per terminal, even within a test


@contextlib.contextmanager
def terminal(cwd: Path, *layerwatch_args: str) -> Iterator[Pane]:
    """``layerwatch ARGS`` in a 100×30 pane of a private tmux server; its exit code is echoed."""
    server = f"layerwatch-test-{os.getpid()}-{next(_servers)}"
    argv = " ".join(
        shlex.quote(a) for a in (sys.executable, "-m", "layerwatch.tui", *layerwatch_args)
    )
    command = f"cd {shlex.quote(str(cwd))} && {argv}; echo EXITED rc=$?; sleep 120"
    env = {"TERM": "xterm-256color", "TEXTUAL_ANIMATIONS": "none"}
    args = ["tmux", "-L", server, "-f", "/dev/null", "new-session", "-d", "-s", "app"]
    args += ["-x", "100", "-y", "30"]
    for name, value in env.items():
        args += ["-e", f"{name}={value}"]
    subprocess.run([*args, command], check=True, timeout=20)
    pane = Pane(server)
    pane.tmux("set", "-sg", "escape-time", "10")  # tmux's 500 ms default delays Escape
    try:
        yield pane
    finally:
        subprocess.run(["tmux", "-L", server, "kill-server"], capture_output=True, timeout=20)


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Pane]:
    with terminal(tmp_path, "demo", "--new-tokens", "8") as pane:
        yield pane


def test_demo_in_a_terminal_finds_the_fault_and_quits_cleanly(demo: Pane) -> None:
    screen = demo.wait_for("first failure", "token 5 · layer 3 · attention.cache")
    assert "tok" in screen and "L3" in screen  # the grid with its block header
    lines = [line for line in screen.splitlines() if line.strip()]
    assert lines[-2].lstrip().startswith("cos")  # the legend above the footer
    screen = demo.wait_for("■ exited", timeout=120)  # both runs finished; their output went to logs
    assert "Traceback" not in screen

    demo.keys("f", "Enter")
    demo.wait_for("operators in execution order", "attention.cache")
    demo.keys("Escape")
    demo.wait_gone("operators in execution order")
    demo.wait_for("first failure", "⏎ open")
    demo.keys("?")
    demo.wait_for("Grid: moving")
    demo.keys("Escape")
    demo.wait_gone("Grid: moving")  # (Escape then q within 100 ms would read as alt+q)

    demo.keys("q")
    screen = demo.wait_for("EXITED rc=", timeout=60)
    assert "EXITED rc=1" in screen  # the planted fault found: a finding, as compare says it
    # The terminal was restored: the shell's line shows and the alternate screen is gone.
    assert "first failure" not in screen


def test_a_comparison_that_gives_up_exits_2_with_its_line(tmp_path: Path) -> None:
    """The TUI shows the worker's note; on ``q`` the command ends as headless ``open`` does:
    its one line and exit 2 — not 0/1, which would read as a verdict on an unfinished compare."""
    golden, target = truncated_weight_dumps(tmp_path)
    with terminal(tmp_path, "open", "--auto-map", str(golden), str(target)) as pane:
        pane.wait_for("live pipeline stopped")
        pane.keys("q")
        screen = pane.wait_for("EXITED rc=", timeout=60)
    assert "EXITED rc=2" in screen, screen
    assert "layerwatch open: live pipeline stopped: LayerwatchError: " in screen, screen
    assert "Traceback" not in screen
