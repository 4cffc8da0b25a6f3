"""Fixtures for the TUI tests: the app over the seeded synthetic source, deterministic."""

from __future__ import annotations

import io
import time
from collections.abc import Callable

import pytest
from layerwatch.tui.app import LayerwatchApp
from rich.console import Console
from support.synthetic import KITCHEN_SINK, Scenario, SyntheticSource
from textual.pilot import Pilot
from textual.widgets import Input, Static


@pytest.fixture(autouse=True)
def no_cursor_blink(monkeypatch: pytest.MonkeyPatch) -> None:
    """A blinking Input cursor would make snapshots depend on timing."""
    monkeypatch.setattr(Input, "_toggle_cursor", lambda self: None)


def make_app(scenario: Scenario = KITCHEN_SINK, *, live: bool = False) -> LayerwatchApp:
    """The app over a synthetic source; truecolor palette whatever ``$TERM`` says."""
    return LayerwatchApp(
        SyntheticSource(scenario, live=live),
        title="layerwatch · synthetic",
        color_system="truecolor",
    )


def plain_text(widget: Static, width: int = 160) -> str:
    """What a Static shows, as plain text (Rich renderables rendered off-screen)."""
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(widget.content)
    return console.export_text()


async def wait_until(pilot: Pilot, condition: Callable[[], object], timeout: float = 10.0) -> None:
    """Let the app run (timers, thread workers) until ``condition()`` holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await pilot.pause(0.02)
