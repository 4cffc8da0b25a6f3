"""The two concrete watchers: inotify (watchdog's native Observer) and polling.

They differ only in how they learn about changes; everything about completeness, duplicates
and directories is the base class's. inotify gets close-write and rename events at once but
can lose events when the kernel queue overflows (we rescan then) or when the watch limit is
reached (we fall back to polling); polling sees every change a ``stat`` can see, on any file
system, one interval late.
"""

from __future__ import annotations

import errno
import logging
import warnings
import weakref

from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver, ObservedWatch

from .base import _EVENTS, Watcher
from .polling import IncrementalPollingObserver

_LIVE: weakref.WeakSet[InotifyWatcher] = weakref.WeakSet()


class _OverflowListener(logging.Handler):
    """watchdog only logs a kernel queue overflow; turn that into a rescan of every watcher."""

    def emit(self, record: logging.LogRecord) -> None:
        if "overflow" in str(record.msg).lower():
            for watcher in list(_LIVE):
                watcher.request_rescan()


_listener = _OverflowListener(logging.WARNING)
for _name in ("watchdog.observers.inotify_c", "watchdog.observers.inotify"):
    logging.getLogger(_name).addHandler(_listener)


class InotifyWatcher(Watcher):
    """watchdog's native observer: inotify on Linux (FSEvents/kqueue elsewhere)."""

    kind = "inotify"
    watch_parent_while_waiting = True
    backstop_scan = True

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        _LIVE.add(self)

    def _new_observer(self) -> BaseObserver:
        # A directory created while its parent's watch is being added gets its watch twice;
        # watchdog warns and keeps one. Benign, and a warning on stderr would garble the TUI.
        warnings.filterwarnings("ignore", "Callback with id", RuntimeWarning, r"watchdog\.")
        return Observer()

    def _schedule_failed(
        self, observer: BaseObserver, path: str, exc: OSError, *, recursive: bool
    ) -> ObservedWatch | None:
        if exc.errno not in (errno.ENOSPC, errno.EMFILE, errno.ENFILE):
            raise exc
        # Out of inotify watches/instances: poll instead of giving up.
        observer.stop()
        self._observer = polling = IncrementalPollingObserver(timeout=max(self.interval, 0.25))
        polling.daemon = True
        polling.start()
        self.kind = "polling"
        self.why = (
            f"polling (inotify limit reached: {exc.strerror}; raise fs.inotify.max_user_watches)"
        )
        self._error(f"inotify limit reached ({exc.strerror}); polling {path} instead")
        return polling.schedule(self._handler, path, recursive=recursive, event_filter=_EVENTS)


class PollingWatcher(Watcher):
    """Polling (:mod:`.polling`): for NFS/Lustre/GPFS, where inotify misses remote writes."""

    kind = "polling"

    def __init__(self, *args: object, interval: float = 0.25, **kwargs: object) -> None:
        kwargs.setdefault("stable_s", max(1.0, 2 * interval))
        super().__init__(*args, interval=interval, **kwargs)  # type: ignore[arg-type]

    def _new_observer(self) -> BaseObserver:
        return IncrementalPollingObserver(timeout=self.interval)
