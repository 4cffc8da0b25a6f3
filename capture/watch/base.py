"""One watcher per dump directory: files landing on disk become :class:`Arrival` events.

The rules every watcher follows, whatever tells it that something changed (inotify events or
polling snapshots):

- each complete file is reported once, never a partial one (the rules live in :mod:`.ledger`);
- new directories (rank ``{device}_{pid}``, token dirs) are reported as DIR and followed;
- a directory that does not exist yet is waited for; one that disappears is reported (GONE)
  and waited for again.

Events are handled on watchdog's thread; a small "settle" thread re-checks pending files, runs
the initial and backstop scans and watches for the directory appearing or vanishing. Nothing
here blocks on the consumer: arrivals go into a queue.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import ClassVar, Protocol

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers.api import BaseObserver, ObservedWatch

from ..arrivals import Arrival, ArrivalKind
from .auto import nearest_existing
from .ledger import Ledger, file_sig, is_ignored

_EVENTS: list[type[FileSystemEvent]] = [
    FileCreatedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileClosedEvent,
    FileDeletedEvent,
    DirCreatedEvent,
    DirMovedEvent,
    DirDeletedEvent,
]
"""The events we act on. Leaving out open/close-without-write matters: our own framing checks
open the files, and would otherwise double the event traffic."""
_STRONG = frozenset({"moved", "closed"})
_CHECK_NOW = frozenset({"moved", "closed", "created"})


class ArrivalSink(Protocol):
    """Where arrivals go: a ``queue.Queue``/``SimpleQueue`` or anything with ``put``."""

    def put(self, item: Arrival) -> None: ...


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: Watcher) -> None:
        self._watcher = watcher

    def dispatch(self, event: FileSystemEvent) -> None:
        try:
            self._watcher._on_event(event)
        except Exception as exc:  # never kill watchdog's thread
            self._watcher._error(f"watcher: {type(exc).__name__}: {exc}")


class Watcher:
    """Base class: subclasses only say which watchdog observer to use (:meth:`_new_observer`)."""

    kind: str = "base"
    """Class default; an inotify watcher that falls back to polling says so on its instance."""
    watch_parent_while_waiting: ClassVar[bool] = False
    """Wake on the parent's directory events while the dump dir does not exist (inotify only)."""
    backstop_scan: ClassVar[bool] = False
    """Rescan now and then in case events were lost (kernel queue overflow, watch limit)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        side: str,
        out: ArrivalSink,
        *,
        interval: float = 0.05,
        stable_s: float = 1.0,
        rescan_s: float = 5.0,
    ) -> None:
        self.root = Path(os.path.abspath(root))
        self.side = side
        self.out = out
        self.interval = interval
        """Seconds between re-checks of pending files (and polls, for polling watchers)."""
        self.stable_s = stable_s
        self.rescan_s = rescan_s
        self.why = ""
        """Why this kind of watcher was chosen (the factory's auto rule), for the notes."""
        self.last_activity = time.monotonic()
        """``time.monotonic()`` of the last event or arrival: lets the pipeline see quiet."""
        self._root_s = str(self.root)
        self._wake = threading.Event()
        self.ledger = Ledger(self._put, stable_s, self._wake.set)
        """What was reported and what is pending (:mod:`.ledger`)."""
        self._stopping = threading.Event()
        self._rescan_due = threading.Event()
        self._observer: BaseObserver | None = None
        self._root_watch: ObservedWatch | None = None
        self._parent_watch: tuple[str, ObservedWatch] | None = None
        self._attached = False
        self._next_scan = 0.0
        self._thread: threading.Thread | None = None
        self._handler = _Handler(self)

    # --- lifecycle -------------------------------------------------------------------------
    def _new_observer(self) -> BaseObserver:
        raise NotImplementedError

    def start(self) -> None:
        """Start watching; returns at once. The initial scan runs on the watcher's thread."""
        if self._thread is not None:
            return
        self._observer = self._new_observer()
        self._observer.daemon = True
        self._observer.start()
        self._thread = threading.Thread(
            target=self._run, name=f"layerwatch-watch-{self.side}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the threads. Idempotent; safe from any thread but the watcher's own."""
        self._stopping.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        observer, self._observer = self._observer, None
        if observer is not None:
            observer.stop()
            if observer is not threading.current_thread():
                observer.join(timeout)

    @property
    def attached(self) -> bool:
        """The directory exists and is being watched."""
        return self._attached

    def idle_for(self) -> float:
        return time.monotonic() - self.last_activity

    def pending(self) -> dict[Path, str]:
        """Files seen but not complete yet, with the reason (``"412 of 4096 bytes"``)."""
        return self.ledger.pending()

    def request_rescan(self) -> None:
        self._rescan_due.set()
        self._wake.set()

    def final_scan(self) -> dict[Path, str]:
        """The writer has stopped: scan everything once more on the caller's thread, report
        files without framing at once (they cannot change any more) and return the files that
        are still incomplete (truncated by a crash, a full disk...)."""
        if os.path.isdir(self._root_s):
            self._scan()
        self.ledger.check_pending(final=True)
        return self.pending()

    # --- the settle thread ----------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                if not self._attached:
                    self._try_attach()
                elif not os.path.isdir(self._root_s):
                    self._gone()
                elif not self._emitter_alive():
                    self._error(
                        f"the watch on {self._root_s} ended unexpectedly; watching it again"
                    )
                    self._detach()
                else:
                    self.ledger.check_pending()
                    if self._rescan_due.is_set() or (
                        self.backstop_scan and time.monotonic() >= self._next_scan
                    ):
                        self._rescan_due.clear()
                        started = time.monotonic()
                        self._scan()
                        took = time.monotonic() - started
                        self._next_scan = time.monotonic() + max(self.rescan_s, 20 * took)
            except Exception as exc:
                self._error(f"watcher: {type(exc).__name__}: {exc}")
            self._wake.wait(self.interval)
            self._wake.clear()

    def _try_attach(self) -> None:
        observer = self._observer
        if observer is None:
            return
        if not os.path.isdir(self._root_s):
            if self.watch_parent_while_waiting:
                self._watch_parent(observer)
            return
        self._root_watch = self._schedule(observer, self._root_s, recursive=True)
        if self._root_watch is None:
            return
        if self._parent_watch is not None:
            self._unschedule(self._parent_watch[1])
            self._parent_watch = None
        self._attached = True
        self._next_scan = time.monotonic() + self.rescan_s
        self._put(ArrivalKind.DIR, self._root_s)
        self._scan()

    def _schedule(
        self, observer: BaseObserver, path: str, *, recursive: bool
    ) -> ObservedWatch | None:
        try:
            return observer.schedule(self._handler, path, recursive=recursive, event_filter=_EVENTS)
        except FileNotFoundError:
            return None  # vanished between the check and the watch: try again next tick
        except OSError as exc:
            return self._schedule_failed(observer, path, exc, recursive=recursive)

    def _schedule_failed(
        self, observer: BaseObserver, path: str, exc: OSError, *, recursive: bool
    ) -> ObservedWatch | None:
        raise exc

    def _watch_parent(self, observer: BaseObserver) -> None:
        parent = str(nearest_existing(self.root))
        if self._parent_watch is not None and self._parent_watch[0] == parent:
            return
        if self._parent_watch is not None:
            self._unschedule(self._parent_watch[1])
            self._parent_watch = None
        watch = self._schedule(observer, parent, recursive=False)
        if watch is not None:
            self._parent_watch = (parent, watch)

    def _unschedule(self, watch: ObservedWatch) -> None:
        observer = self._observer
        if observer is not None:
            with contextlib.suppress(KeyError, OSError, RuntimeError):
                observer.unschedule(watch)

    def _emitter_alive(self) -> bool:
        observer, watch = self._observer, self._root_watch
        if observer is None or watch is None:
            return True
        return any(e.watch == watch and e.is_alive() for e in observer.emitters)

    def _detach(self) -> None:
        """Drop the root watch; the next tick schedules it again and rescans (no duplicates)."""
        if self._root_watch is not None:
            self._unschedule(self._root_watch)
            self._root_watch = None
        self._attached = False

    def _gone(self) -> None:
        self._detach()
        self.ledger.gone()
        self._put(
            ArrivalKind.GONE,
            self._root_s,
            f"{self._root_s} was removed while being watched; waiting for it to come back",
        )

    # --- events ----------------------------------------------------------------------------
    def _inside(self, path: str) -> bool:
        return path == self._root_s or path.startswith(self._root_s + "/")

    def _on_event(self, event: FileSystemEvent) -> None:
        if self._stopping.is_set():
            return
        etype = event.event_type
        moved = etype == "moved"
        path = os.fsdecode(event.dest_path if moved else event.src_path)
        if event.is_directory:
            if not self._attached:
                if etype in ("created", "moved"):
                    self._wake.set()  # maybe the dump dir (or a parent of it) appeared
            elif etype in ("created", "moved") and self._inside(path) and path != self._root_s:
                self.ledger.new_dir(path)
            elif etype == "deleted" and path == self._root_s:
                self._wake.set()
            return
        if not self._attached or not self._inside(path):
            return
        self.last_activity = time.monotonic()
        if moved:
            self.ledger.forget(os.fsdecode(event.src_path))
        if etype == "deleted":
            self.ledger.forget(path)
        elif etype in ("created", "modified", "moved", "closed"):
            self.ledger.consider(path, strong=etype in _STRONG, check_now=etype in _CHECK_NOW)

    # --- scanning --------------------------------------------------------------------------
    def _scan(self) -> None:
        """Walk the tree: catches files that landed before the watch (or whose events were
        lost). Cheap for files already reported: one ``stat`` from the directory entry."""
        stack = [self._root_s]
        while stack and not self._stopping.is_set():
            current = stack.pop()
            try:
                with os.scandir(current) as entries:
                    listed = list(entries)
            except OSError:
                continue
            for entry in listed:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                        self.ledger.new_dir(entry.path)
                    elif (
                        entry.is_file()
                        and not is_ignored(entry.name)
                        and not self.ledger.reported(entry.path, file_sig(entry.stat()))
                    ):
                        self.ledger.consider(entry.path, strong=False, check_now=True)
                except OSError:
                    continue

    # --- output ----------------------------------------------------------------------------
    def _put(self, kind: ArrivalKind, path: str, message: str = "") -> None:
        self.last_activity = time.monotonic()
        self.out.put(Arrival(self.side, kind, Path(path), message=message))

    def _error(self, message: str) -> None:
        self._put(ArrivalKind.ERROR, self._root_s, message)
