"""The record that crosses from capture's watchers to the engine: "this file landed".

Watchers know nothing about tensors; they only say which path became complete (or grew, for the
append-only index). The engine's readers turn arrivals into tensor records.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path


class ArrivalKind(str, Enum):
    FILE = "file"
    """A complete file landed (renamed into place, closed after writing, or stable in size)."""
    GREW = "grew"
    """An append-only file (layerwatch ``index.jsonl``) has new bytes."""
    DIR = "dir"
    """A new directory appeared (a rank ``{device}_{pid}`` or a token directory)."""
    GONE = "gone"
    """The watched directory (or a part of it) was removed."""
    ERROR = "error"
    """The watcher hit a problem; ``message`` says what."""


@dataclass(frozen=True, slots=True)
class Arrival:
    side: str
    """``"golden"`` or ``"target"``: which run this belongs to."""
    kind: ArrivalKind
    path: Path
    seen: float = field(default_factory=time.monotonic)
    """``time.monotonic()`` when the watcher saw it: the start of the arrival-latency clock."""
    message: str = ""
