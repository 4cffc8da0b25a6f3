"""Fixtures for the TUI tests: the app over the seeded synthetic source, deterministic."""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from layerwatch.tui.app import LayerwatchApp
from rich.console import Console
from support.synthetic import KITCHEN_SINK, Scenario, SyntheticSource
from textual.app import App
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


def save_shot(app: App[object], name: str, fallback: Path) -> Path:
    """Save an SVG of the app as it is now: under ``fallback`` (a tmp dir) in a test run, or
    into ``$LAYERWATCH_SCREENSHOTS`` (``screenshots/``) to refresh the checked-in ones."""
    where = Path(os.environ.get("LAYERWATCH_SCREENSHOTS") or fallback)
    where.mkdir(parents=True, exist_ok=True)
    path = Path(app.save_screenshot(name, str(where)))
    assert "<svg" in path.read_text(encoding="utf-8")[:2000]
    return path
