"""What a watcher has reported and what it is still waiting for: the once-and-complete rules.

Every event or scan hit for a file ends up in :meth:`Ledger.consider`. A file is reported
(``FILE``) once its own framing says it is whole (:mod:`..stability`), or — without a framing
rule — once a close/rename was seen or its size and mtime stayed put for ``stable_s``; until then
it is *pending* and re-checked on every tick (a ``stat`` first; read again only if it changed).
Reports are keyed by the file's (inode, size, mtime): duplicate events, a scan racing the events
and late "modified" events collapse into one arrival, while a rewritten file (a new version)
arrives again. The append-only ``index.jsonl`` is reported as ``GREW`` on every size change.
Thread-safe: the observer thread and the watcher's own thread both call in.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..arrivals import ArrivalKind
from ..format import TMP_PREFIX
from ..stability import Completeness, check_file

_IGNORED_SUFFIXES = (".log", ".tmp", ".part", ".swp", ".lock", "~", ".crdownload")
_GREW_SUFFIXES = (".jsonl",)
Sig = tuple[int, int, int]
_UNCHECKED: Sig = (-1, -1, -1)


def is_ignored(name: str) -> bool:
    """Temp and hidden files are never data (our writer's temps start with ``.tmp-``)."""
    return name.startswith((TMP_PREFIX, ".")) or name.endswith(_IGNORED_SUFFIXES)


def file_sig(st: os.stat_result) -> Sig:
    return (st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(slots=True)
class _Pending:
    sig: Sig
    since: float
    """When ``sig`` was first seen (the stable-size clock)."""
    state: Completeness
    strong: bool
    """A close or rename was seen: enough for a file without framing."""
    reason: str


class Ledger:
    def __init__(
        self, put: Callable[[ArrivalKind, str], None], stable_s: float, wake: Callable[[], None]
    ) -> None:
        self._put = put
        self._wake = wake
        self.stable_s = stable_s
        self._lock = threading.Lock()
        self._emitted: dict[str, Sig] = {}
        self._grown: dict[str, int] = {}
        self._dirs: set[str] = set()
        self._pending: dict[str, _Pending] = {}

    def reported(self, path: str, sig: Sig) -> bool:
        """This version of ``path`` was reported already (a scan's cheap skip)."""
        with self._lock:
            return self._emitted.get(path) == sig

    def pending(self) -> dict[Path, str]:
        with self._lock:
            return {Path(p): e.reason or "not finished" for p, e in self._pending.items()}

    def new_dir(self, path: str) -> None:
        with self._lock:
            if path in self._dirs:
                return
            self._dirs.add(path)
        self._put(ArrivalKind.DIR, path)

    def forget(self, path: str) -> None:
        with self._lock:
            self._pending.pop(path, None)
            self._emitted.pop(path, None)
            self._grown.pop(path, None)

    def gone(self) -> None:
        """The directory vanished: nothing is pending; directories may come back."""
        with self._lock:
            self._pending.clear()
            self._dirs.clear()

    def consider(self, path: str, *, strong: bool, check_now: bool) -> None:
        """A file changed. ``strong``: closed after writing or renamed into place;
        ``check_now``: read its framing now (else leave it to the next tick)."""
        name = path.rsplit("/", 1)[-1]
        if is_ignored(name):
            return
        if name.endswith(_GREW_SUFFIXES):
            self._grew(path)
            return
        # Stat *before* reading: what is recorded must describe the bytes that were judged,
        # or a write landing in between would leave a complete file pending for ever.
        try:
            sig = file_sig(os.stat(path))
        except OSError:
            return
        if not check_now:
            self._mark_pending(path, sig, strong)
            return
        check = check_file(path)
        if not _unchanged(path, sig):  # written to while we read it: judge it next tick
            self._mark_pending(path, _UNCHECKED, strong)
        elif _done(check.state, strong):
            self._emit_file(path, sig)
        else:
            self._mark_pending(path, sig, strong, check.state, check.reason)

    def check_pending(self, *, final: bool = False) -> None:
        """Re-check pending files; ``final``: the writer is gone, report unframed files now."""
        with self._lock:
            items = list(self._pending.items())
        now = time.monotonic()
        for path, entry in items:
            try:
                sig = file_sig(os.stat(path))
            except OSError:
                self.forget(path)
                continue
            if sig != entry.sig:
                check = check_file(path)
                if not _unchanged(path, sig):
                    continue  # still being written: next tick
                if _done(check.state, entry.strong):
                    self._emit_file(path, sig)
                    continue
                with self._lock:
                    entry.sig, entry.since = sig, now
                    entry.state, entry.reason = check.state, check.reason
            if entry.state is Completeness.UNKNOWN and (
                final or now - entry.since >= self.stable_s
            ):
                self._emit_file(path, entry.sig)

    def _mark_pending(
        self, path: str, sig: Sig, strong: bool, state: Completeness | None = None, reason: str = ""
    ) -> None:
        now = time.monotonic()
        with self._lock:
            if self._emitted.get(path) == sig:
                return  # a late event for a file already reported
            entry = self._pending.get(path)
            if entry is None:
                # Not checked yet (state None): an unmatched sig makes the next tick check it.
                first = _UNCHECKED if state is None else sig
                kind = state or Completeness.INCOMPLETE
                self._pending[path] = _Pending(first, now, kind, strong, reason)
            else:
                entry.strong = entry.strong or strong
                if state is not None and entry.sig != sig:
                    entry.sig, entry.since, entry.state, entry.reason = sig, now, state, reason
        if strong:
            self._wake()

    def _grew(self, path: str) -> None:
        try:
            size = os.stat(path).st_size
        except OSError:
            return
        with self._lock:
            if self._grown.get(path) == size:
                return
            self._grown[path] = size
        self._put(ArrivalKind.GREW, path)

    def _emit_file(self, path: str, sig: Sig) -> None:
        """Report ``path`` as it was when checked (``sig``): if it changed since, the next
        event or tick sees another signature and checks that version too."""
        with self._lock:
            self._pending.pop(path, None)
            if self._emitted.get(path) == sig:
                return
            self._emitted[path] = sig
        self._put(ArrivalKind.FILE, path)


def _unchanged(path: str, sig: Sig) -> bool:
    """The file still has ``sig``: the bytes just judged are the ones ``sig`` describes."""
    try:
        return file_sig(os.stat(path)) == sig
    except OSError:
        return False


def _done(state: Completeness, strong: bool) -> bool:
    return state is Completeness.COMPLETE or (strong and state is Completeness.UNKNOWN)
