"""The background writer thread both dump formats share: batching loop and failure policy.

The model thread only copies tensors and queues them; this thread computes statistics, writes
files and appends index records. Failure policy (disk full, directory gone, permission lost):
print ONE line on stderr, stop capturing (the hooks become no-ops, queued copies are dropped so
the model never waits), keep everything already written intact, and let the model finish.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import threading
from pathlib import Path
from typing import Any

from .config import DumpConfig
from .handoff import ByteQueue, Marker, StreamEvent, TensorItem, WeightItem

_CONTROL = frozenset({Marker, StreamEvent})
_HOLDS_COPY = frozenset({TensorItem, WeightItem})


class WriterThread:
    """Consumes a :class:`ByteQueue`; subclasses say how a batch of items lands on disk."""

    takes_records = False
    """The hooks queue ``(order, records)`` groups (``capture/recorder.py`` ``Record``), not
    items: the writer process's writer, which makes items only of what it writes itself."""

    def __init__(self, config: DumpConfig, run_dir: Path) -> None:
        self.config = config
        self.run_dir = run_dir
        self.queue = ByteQueue(config.queue_bytes, config.batch_bytes)
        self.failed: str | None = None
        """The one-line reason capture stopped, or ``None``."""
        self.on_failure: list[Any] = []
        """Callbacks run (in the writer thread) when capture stops, e.g. turning hooks off."""
        self.tensors_written = 0
        self.bytes_written = 0
        self.tokens_seen = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="layerwatch-writer", daemon=True)

    # --- subclass interface -------------------------------------------------------------
    def write_items(self, items: list[Any]) -> None:
        """Write one batch (tensor, token, weight and topology items in queue order)."""
        raise NotImplementedError

    def finish(self, status: str) -> None:
        """Write the end records (``status`` is ``complete`` or the failure line)."""

    # --- life cycle -----------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued so far is on disk (or capture stopped)."""
        if not self._thread.is_alive():
            return self.queue.pending_items == 0
        marker = Marker("flush")
        self.queue.put([marker], 0, urgent=True)
        return marker.done.wait(timeout)

    def close(self) -> None:
        """Write what is queued, then the end records; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            self.queue.put([Marker("stop")], 0, urgent=True)
            self._thread.join()

    @property
    def closed(self) -> bool:
        return self._closed

    # --- the loop -------------------------------------------------------------------------
    def _run(self) -> None:
        interval = self.config.flush_interval
        while True:
            items, nbytes = self.queue.take(interval)
            control = [it for it in items if type(it) in _CONTROL]  # rare: markers, CUDA events
            work = [it for it in items if type(it) not in _CONTROL] if control else items
            markers = [it for it in control if type(it) is Marker]
            for it in control:
                if type(it) is StreamEvent:
                    it.wait()
            if work and self.failed is None:
                try:
                    self.write_items(work)
                except Exception as exc:  # never let the writer die: the model would block
                    self.fail(exc, getattr(exc, "filename", None) or self.run_dir)
            for it in work:  # drop our references to the copies now, not at the next batch
                if type(it) in _HOLDS_COPY:
                    it.tensor = None
            self.queue.release(nbytes, len(items))
            stop = any(m.kind == "stop" for m in markers)
            if stop:
                try:
                    self.finish(self.failed or "complete")
                except Exception as exc:
                    self.fail(exc, self.run_dir)
            for marker in markers:
                marker.done.set()
            if stop:
                return

    def fail(self, exc: BaseException, where: object) -> None:
        """Stop capture after an error: one line on stderr, hooks off, nothing written undone."""
        self.stop_capture(describe_failure(exc, where))

    def stop_capture(self, line: str) -> None:
        """:meth:`fail` with its one line already made (the writer process sends its own)."""
        if self.failed is not None:
            return
        self.failed = line
        print(f"layerwatch: {self.failed}", file=sys.stderr, flush=True)
        self.queue.drain()
        for callback in self.on_failure:
            with contextlib.suppress(Exception):
                callback(self.failed)
        with contextlib.suppress(Exception):
            self.record_failure(self.failed)

    def record_failure(self, message: str) -> None:
        """Best effort: leave a note in the dump that capture stopped (may itself fail)."""

    def forget(self) -> None:
        """In a forked child: let go of what the parent's writer holds (nothing, here)."""


FAILURE_TAIL = "the model keeps running; tensors already written are intact"


def describe_failure(exc: BaseException, where: object) -> str:
    """``capture stopped: disk full writing /x/y (...)``: one line, says what the user can do."""
    tail = FAILURE_TAIL
    if isinstance(exc, OSError):
        path = exc.filename or where
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            what = "disk full"
        elif exc.errno == errno.EFBIG:
            what = "file size limit reached"
        elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            what = "no permission to write"
        elif exc.errno in (errno.ENOENT, errno.ENOTDIR):
            what = "dump directory is gone"
        else:
            what = os.strerror(exc.errno) if exc.errno else str(exc)
        return f"capture stopped: {what} writing {path} ({tail})"
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"capture stopped: {type(exc).__name__}: {first} ({tail})"
