"""Which writer a test capture uses (``capture/writer_process.py``): ``thread`` (the writer in
the model process), ``process`` (the writer process from the run's start) or ``handover`` (the
default path, placed: the thread writes ``spawn_after`` items, then the process takes over)."""

from __future__ import annotations

import pytest
from layerwatch.capture.writer_process import ENV, ProcessWriter

WRITERS = ("thread", "process", "handover")

SELECT = """
import os
from layerwatch.capture.writer_process import ENV, ProcessWriter
def select_writer(mode):
    if mode == "handover":  # the default path: the thread writes the first batch, then hands over
        os.environ.pop(ENV, None)
        ProcessWriter.spawn_after, ProcessWriter.wait_for_start = 1, True
    else:
        os.environ[ENV] = mode
"""
"""The same choice in a child process's script (define, then call ``select_writer(mode)``)."""


def select(monkeypatch: pytest.MonkeyPatch, mode: str, spawn_after: int = 1) -> None:
    """Use ``mode`` for the captures of this test; ``handover`` waits for the process at the
    first batch after ``spawn_after`` items, so the hand-over point does not depend on timing."""
    if mode == "handover":
        monkeypatch.delenv(ENV, raising=False)
        monkeypatch.setattr(ProcessWriter, "spawn_after", spawn_after)
        monkeypatch.setattr(ProcessWriter, "wait_for_start", True)
    else:
        monkeypatch.setenv(ENV, mode)
