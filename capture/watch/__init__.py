"""Watchers: files landing under a dump directory become :class:`~..arrivals.Arrival` events.

One small base class (:class:`Watcher`), two observers (inotify, polling) and a factory that
applies the auto rule (:mod:`.auto`): poll on network/parallel file systems, inotify elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

from .auto import should_poll
from .base import ArrivalSink, Watcher
from .ledger import is_ignored
from .observers import InotifyWatcher, PollingWatcher

__all__ = [
    "ArrivalSink",
    "InotifyWatcher",
    "PollingWatcher",
    "Watcher",
    "is_ignored",
    "open_watcher",
]


def open_watcher(
    root: str | os.PathLike[str],
    side: str,
    out: ArrivalSink,
    *,
    poll: bool | None = None,
    interval: float = 0.25,
) -> Watcher:
    """A watcher for ``root`` (which may not exist yet), not started.

    ``poll=True`` forces polling every ``interval`` seconds; ``None`` applies the auto rule.
    """
    use_poll, why = should_poll(Path(root), poll)
    watcher: Watcher
    if use_poll:
        watcher = PollingWatcher(root, side, out, interval=interval)
    else:
        watcher = InotifyWatcher(root, side, out)
    watcher.why = why
    return watcher
