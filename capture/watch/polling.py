"""A polling observer whose cost follows what changes, not the size of the dump.

watchdog's ``PollingObserver`` stats every file of the tree at every poll: measured here at
~400 ms per poll for 10 000 files, more than a 250 ms interval, so a large msit/ATB dump (one
file per tensor) falls further behind the longer it runs. This emitter keeps watchdog's observer
and event types but polls incrementally:

- a directory is re-listed only when its mtime changed, or was set less than ``RACY_S`` ago
  (coarse or skewed timestamps on network file systems), or at the periodic full pass;
- files that can change after they appear (``*.json*``, ``*.csv``, files without a framing
  rule) are re-stat'ed at every poll; tensor files (``.bin .pth .pt .safetensors .npy``) are
  stat'ed when they appear; their growth to completion is followed by the watcher's framing
  checks, which re-stat only the incomplete ones;
- a full pass (every file re-stat'ed) runs every ``FULL_S`` seconds, or 20 times as long as the
  last one took, as a backstop.

Renames within one poll are reported as moves (matched by inode).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
)
from watchdog.observers.api import (
    DEFAULT_OBSERVER_TIMEOUT,
    BaseObserver,
    EventEmitter,
    EventQueue,
    ObservedWatch,
)

RACY_S = 2.0
FULL_S = 10.0
_SETTLED = (".bin", ".pth", ".pt", ".safetensors", ".npy")
"""Tensor files: written once; followed by framing checks, not by re-stat at every poll."""

Sig = tuple[int, int, int]


def _mutable(name: str) -> bool:
    return not name.endswith(_SETTLED)


@dataclass(slots=True)
class _Dir:
    mtime: int
    files: dict[str, Sig] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)


class IncrementalPollingEmitter(EventEmitter):
    def __init__(
        self,
        event_queue: EventQueue,
        watch: ObservedWatch,
        *,
        timeout: float = DEFAULT_OBSERVER_TIMEOUT,
        event_filter: list[type[FileSystemEvent]] | None = None,
    ) -> None:
        super().__init__(event_queue, watch, timeout=timeout, event_filter=event_filter)
        self._dirs: dict[str, _Dir] = {}
        self._lock = threading.Lock()
        self._next_full = 0.0
        self._took = 0.0

    def on_thread_start(self) -> None:
        self._poll(quiet=True)  # the baseline: what exists now is not reported (as watchdog)

    def queue_events(self, timeout: float) -> None:
        # A fixed period: the time the last poll took comes off the wait (watchdog's emitter
        # waits the whole interval after each poll, so its period grows with the tree).
        if self.stopped_event.wait(max(0.0, timeout - self._took)):
            return
        with self._lock:
            if not self.should_keep_running():
                return
            if not os.path.isdir(self.watch.path):
                self.queue_event(DirDeletedEvent(self.watch.path))
                self.stop()
                return
            try:
                self._poll(quiet=False)
            except Exception:  # a bad entry must not end polling (the thread would just die)
                self._next_full = 0.0  # start over with a full pass next time

    def _poll(self, *, quiet: bool) -> None:
        started = time.monotonic()
        full = started >= self._next_full
        now = time.time()
        created: list[tuple[str, Sig]] = []
        deleted: list[tuple[str, Sig]] = []
        events: list[FileSystemEvent] = []
        root = str(self.watch.path)
        stack, seen = [root], set()
        while stack:
            path = stack.pop()
            seen.add(path)
            try:
                st = os.stat(path)
            except OSError:
                continue
            old = self._dirs.get(path)
            if (
                old is None
                or full
                or st.st_mtime_ns != old.mtime
                or now - st.st_mtime_ns / 1e9 < RACY_S
            ):
                new = self._list(path, st.st_mtime_ns, old, full)
                if new is None:
                    continue
                self._diff(path, old, new, created, deleted, events)
                self._dirs[path] = new
            else:
                new = old
                for name, sig in list(new.files.items()):
                    if _mutable(name):
                        self._restat(path, name, sig, new, events)
            stack.extend(os.path.join(path, d) for d in new.dirs)
        for path in [p for p in self._dirs if p not in seen]:
            del self._dirs[path]
        if not quiet:
            self._emit(created, deleted, events)
        self._took = time.monotonic() - started
        if full:
            self._next_full = time.monotonic() + max(FULL_S, 20 * self._took)

    def _list(self, path: str, mtime: int, old: _Dir | None, full: bool) -> _Dir | None:
        new = _Dir(mtime)
        try:
            with os.scandir(path) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            new.dirs.add(entry.name)
                        elif entry.is_file():
                            known = old.files.get(entry.name) if old is not None else None
                            if known is not None and not full and not _mutable(entry.name):
                                new.files[entry.name] = known
                            else:
                                s = entry.stat()
                                new.files[entry.name] = (s.st_ino, s.st_size, s.st_mtime_ns)
                    except OSError:
                        continue
        except OSError:
            return None
        return new

    def _restat(
        self, path: str, name: str, sig: Sig, state: _Dir, events: list[FileSystemEvent]
    ) -> None:
        try:
            s = os.stat(os.path.join(path, name))
        except OSError:
            return  # gone: the directory's mtime changed too, the next listing reports it
        now = (s.st_ino, s.st_size, s.st_mtime_ns)
        if now != sig:
            state.files[name] = now
            events.append(FileModifiedEvent(os.path.join(path, name)))

    def _diff(
        self, path: str, old: _Dir | None, new: _Dir, created: list, deleted: list, events: list
    ) -> None:
        before = old.files if old is not None else {}
        for name, sig in new.files.items():
            prev = before.get(name)
            full = os.path.join(path, name)
            if prev is None:
                created.append((full, sig))
            elif prev[0] != sig[0]:
                events.append(FileCreatedEvent(full))  # replaced by a rename: a new file
            elif prev != sig:
                events.append(FileModifiedEvent(full))
        for name, sig in before.items():
            if name not in new.files:
                deleted.append((os.path.join(path, name), sig))
        old_dirs = old.dirs if old is not None else set()
        for name in new.dirs - old_dirs:
            events.append(DirCreatedEvent(os.path.join(path, name)))
        for name in old_dirs - new.dirs:
            events.append(DirDeletedEvent(os.path.join(path, name)))

    def _emit(self, created: list, deleted: list, events: list) -> None:
        for event in events:
            if isinstance(event, DirCreatedEvent):
                self.queue_event(event)  # directories before the files in them
        by_inode = {sig[0]: src for src, sig in deleted}
        moved_from = set()
        for dest, sig in created:
            src = by_inode.get(sig[0])
            if src is not None:
                moved_from.add(src)
                self.queue_event(FileMovedEvent(src, dest))
            else:
                self.queue_event(FileCreatedEvent(dest))
        for src, _ in deleted:
            if src not in moved_from:
                self.queue_event(FileDeletedEvent(src))
        for event in events:
            if not isinstance(event, DirCreatedEvent):
                self.queue_event(event)


class IncrementalPollingObserver(BaseObserver):
    """watchdog's observer with :class:`IncrementalPollingEmitter`; ``timeout`` = poll interval."""

    def __init__(self, *, timeout: float = 0.25) -> None:
        super().__init__(IncrementalPollingEmitter, timeout=timeout)
