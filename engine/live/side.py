"""One side (golden or target) of a live comparison: its producer, watcher and reader.

A side either launches a command into its dump directory (``capture.launch``) or attaches to a
directory something else writes. It opens its reader once the directory holds a dump it can
recognise, feeds the reader the paths the watcher reports, and decides when the side is
finished:

- launched: when the command has exited, its last files were scanned (a final full poll) —
  whatever it wrote before crashing is kept and compared;
- attached: when the writer says so (layerwatch ``K_END`` on every rank), or when nothing new
  landed for ``idle_s`` seconds after the reader opened (``idle_s=0``: at once, for finished
  dumps); a final full scan comes first.
"""

from __future__ import annotations

import dataclasses
import queue
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from layerwatch.capture.arrivals import Arrival, ArrivalKind
from layerwatch.capture.errors import LayerwatchError
from layerwatch.capture.launch import Child, LaunchSpec
from layerwatch.engine.readers import DumpReader, ReaderUpdate, detect, msit_runs, open_dump
from layerwatch.engine.seam import RunStatus

if TYPE_CHECKING:
    from layerwatch.capture.watch.base import Watcher

QUIET_S = 0.25
"""After a launched command exits: wait this long for the watcher to go quiet (or 2 s)."""
REOPEN_S = 0.5
"""How often to look for a recognisable dump while none is open yet."""
CHUNK_BYTES = 1 << 20
"""Index bytes of a finished dump read a worker round (``open``): the session compares and
settles each part before the next is read, so its records never all sit in memory at once."""


@dataclass
class SideSpec:
    """What one side is: "launch this command into ``dir``" or "attach to ``dir``"."""

    dir: Path
    launch: LaunchSpec | None = None
    idle_s: float = 30.0
    """Attached sides: finish after this long without new files (0: right after the first scan)."""
    watch: bool = True
    """``False`` for finished dumps: one full scan, no watcher."""


def find_dump(root: Path) -> Path | None:
    """``root`` if it holds a recognisable dump, else its newest subdirectory that does
    (``msit_dump_{timestamp}`` under a launch directory); ``None`` while there is none."""
    if root.is_file():
        return root if detect(root) is not None else None  # msprobe's dump.json itself
    if not root.is_dir():
        return None
    if detect(root) is not None:
        return root
    try:
        subdirs = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return None
    for sub in sorted(
        subdirs, key=lambda p: (p.name.startswith("msit_dump_"), p.name), reverse=True
    ):
        if detect(sub) is not None:
            return sub
    return None


class LiveSide:
    def __init__(self, name: str, spec: SideSpec) -> None:
        self.name = name
        self.spec = spec
        self.child = Child(spec.launch) if spec.launch is not None else None
        self.watcher: Watcher | None = None
        self.reader: DumpReader | None = None
        self.finished = False
        self.notes: list[str] = []
        self.gone = False
        self._last_new = time.monotonic()
        self._next_open = 0.0
        self._open_error = ""
        self._exited_at: float | None = None
        self._state = "launching" if self.child else "waiting"
        self._message = ""
        self._status: RunStatus | None = None
        self.chunked = False
        """A finished dump read a part at a time (:data:`CHUNK_BYTES`) until its index is
        consumed; then the usual final poll."""
        self._chunk_top = -1
        self._forgot = -1
        """Tokens below this were forgotten by the reader (the session settled them)."""

    # --- lifecycle -------------------------------------------------------------------------
    def start(
        self, arrivals: queue.SimpleQueue[Arrival | None], *, poll: bool | None, interval: float
    ) -> None:
        """Launch the command (raises :class:`LayerwatchError` if it cannot start), then watch."""
        if self.child is not None:
            self.child.start()
            self._state = "running"
        if self.spec.watch:
            from layerwatch.capture.watch import open_watcher

            self.watcher = open_watcher(
                self.spec.dir, self.name, arrivals, poll=poll, interval=interval
            )
            self.watcher.start()

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()
        self.stop_watching()

    def stop_watching(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()

    def forget_before(self, token: int) -> None:
        """The session settled every token before ``token``: the reader may drop what it keeps
        of them (the keys it handed out, per-token orders), which would otherwise grow with
        every tensor of a watched run. A chunked read forgets as it goes (:meth:`_next_chunk`)."""
        forget = getattr(self.reader, "forget_before", None)
        if forget is not None and not self.chunked and token > self._forgot:
            self._forgot = token
            forget(token)

    # --- input -----------------------------------------------------------------------------
    def ingest(self, arrivals: list[Arrival]) -> list[ReaderUpdate]:
        """Turn this side's arrivals into reader updates (opening the reader when it can)."""
        changed: list[Path] = []
        for arrival in arrivals:
            if arrival.kind is ArrivalKind.GONE:
                self.gone = True
                self.notes.append(arrival.message)
            elif arrival.kind is ArrivalKind.ERROR:
                self.notes.append(arrival.message)
            else:
                self.gone = False
                changed.append(arrival.path)
        if self.finished or not changed:
            return []
        self._last_new = time.monotonic()
        if self.reader is None:
            return self._try_open()
        return self._poll(changed)

    def _try_open(self) -> list[ReaderUpdate]:
        self._next_open = time.monotonic() + REOPEN_S
        where = find_dump(self.spec.dir)
        if where is None:
            return []
        try:
            self.reader = open_dump(where, side=self.name)
        except LayerwatchError as exc:
            if str(exc) != self._open_error:
                self._open_error = str(exc)
                self.notes.append(str(exc))
            return []
        runs = msit_runs(self.spec.dir) if where != self.spec.dir else []
        if len(runs) > 1:
            self.notes.append(
                f"{self.spec.dir} holds {len(runs)} msit dumps: following the newest, {where.name}"
            )
        if self.child is None:
            self._state = "attached"
        self._last_new = time.monotonic()
        if (
            not self.spec.watch
            and self.child is None
            and hasattr(self.reader, "poll_chunk")
            and getattr(self.reader, "live_chunks", True)
        ):
            self.chunked = True
            return self._next_chunk()
        return self._poll(None)

    def _next_chunk(self) -> list[ReaderUpdate]:
        """The next part of a finished dump's index; ``chunked`` goes False once it is all read."""
        reader = self.reader
        assert reader is not None
        try:
            update = reader.poll_chunk(CHUNK_BYTES)  # type: ignore[attr-defined]
        except LayerwatchError as exc:
            self.notes.append(str(exc))
            update = None
        except Exception as exc:  # a reader bug must not stop the other side
            self.notes.append(f"reading {self.spec.dir} failed: {type(exc).__name__}: {exc}")
            update = None
        if update is None:
            self.chunked = False
            return []
        top = max((r.key.token for r in update.tensors), default=self._chunk_top)
        if top > self._chunk_top + 2:  # index order is token order: older keys do not recur
            self._chunk_top = top
            reader.forget_before(top - 2)  # type: ignore[attr-defined]
        self._last_new = time.monotonic()
        return [update] if update else []

    def _poll(self, changed: list[Path] | None, *, final: bool = False) -> list[ReaderUpdate]:
        assert self.reader is not None
        try:
            update = self.reader.poll(changed, final=final)
        except LayerwatchError as exc:
            self.notes.append(str(exc))
            return []
        except Exception as exc:  # a reader bug must not stop the other side
            self.notes.append(f"reading {self.spec.dir} failed: {type(exc).__name__}: {exc}")
            return []
        if update.complete and self.child is not None and self._exited_at is None:
            # A launched job may still start ranks: only its exit says it is finished.
            update = dataclasses.replace(update, complete=False)
        if update.complete:
            self.finished = True
            if self.child is None:
                self._state = "complete"
        return [update] if update else []

    # --- time passes -----------------------------------------------------------------------
    def tick(self) -> tuple[list[ReaderUpdate], bool]:
        """Child exit, finishing rules, retrying to open. Returns (updates, finish now?)."""
        now = time.monotonic()
        updates: list[ReaderUpdate] = []
        if self.finished:
            return updates, False
        if self.chunked:
            return self._next_chunk(), False
        if self.reader is None and now >= self._next_open:
            updates += self._try_open()
        if self.child is not None:
            if self._exited_at is None and self.child.poll() is not None:
                self._exited_at = now
                self._child_ended()
            if self._exited_at is not None:
                quiet = self.watcher is None or self.watcher.idle_for() >= QUIET_S
                if quiet or now - self._exited_at >= 2.0:
                    return updates + self._final(), True
            return updates, False
        if self.reader is not None and now - self._last_new >= self.spec.idle_s:
            return updates + self._final(), True
        return updates, False

    def _child_ended(self) -> None:
        assert self.child is not None
        code = self.child.poll()
        self._state = "exited" if code == 0 else "crashed"
        self._message = self.child.describe()
        if code != 0:
            log = self.child.spec.log_path
            self.notes.append(f"{self.name} command {self._message} (log: {log})")

    def _final(self) -> list[ReaderUpdate]:
        """The writer is done: last scan of the directory, then one full poll of the reader."""
        self.finished = True
        incomplete: dict[Path, str] = self.watcher.final_scan() if self.watcher is not None else {}
        if self.reader is None:
            self._try_open()
        if self.reader is None:
            self._note_incomplete(incomplete)
            what = "nothing was dumped" if self.child is not None else "no dump appeared"
            self.notes.append(f"{what} in {self.spec.dir}")
            return []
        # Final: files the reader still finds incomplete are truncated; it names each one.
        updates = self._poll(None, final=True)
        named = {n.split(": ", 1)[0] for u in updates for n in u.notes}
        self._note_incomplete({p: w for p, w in incomplete.items() if str(p) not in named})
        if self.child is None and self._state != "complete":
            # Only our format says when a run ends (K_END on every rank): idle without it, the
            # writer stopped part-way (killed, crashed), which "complete" would hide.
            if getattr(self.reader, "fmt", None) == "layerwatch":
                self._state = "stopped"
                self.notes.append(
                    f"{self.spec.dir} has no end record: its run stopped before it "
                    "finished (what it wrote is compared)"
                )
            else:
                self._state = "complete"
        return updates

    def _note_incomplete(self, incomplete: dict[Path, str]) -> None:
        """The watcher's files that never became whole (those the reader did not name)."""
        if incomplete:
            path, why = next(iter(incomplete.items()))
            more = f" and {len(incomplete) - 1} more" if len(incomplete) > 1 else ""
            self.notes.append(f"incomplete file skipped: {path} ({why}){more}")

    # --- status ----------------------------------------------------------------------------
    def status(self, tokens: int, tensors: int) -> RunStatus | None:
        """The current :class:`RunStatus`, or ``None`` when it did not change."""
        state = self._state
        message = self._message
        if self.gone:
            message = f"{self.spec.dir} was removed"
        elif state == "waiting":  # no dump yet; the directory itself may still be to come
            where = self.spec.dir
            message = f"waiting for {where}{'' if where.exists() else ' to appear'}"
        elif self.watcher is not None and not message and state in ("attached", "running"):
            message = self.watcher.why
        pid = self.child.pid if self.child is not None else None
        code = self.child.exit_code if self.child is not None else None
        status = RunStatus(self.name, state, pid, code, tokens, tensors, message)
        if status == self._status:
            return None
        self._status = status
        return status
