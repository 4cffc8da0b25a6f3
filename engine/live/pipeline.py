"""The live pipeline: launched or attached dumps in, result batches out (a ComparisonSource).

::

    child process ─writes→ disk ─watchers (capture.watch)→ arrival queue
    ONE engine worker: reader.poll(changed) → session.add_update → session.flush (every ~80 ms)
                       ─ResultBatch (cells, pairs, runs, notes)→ sink ← TUI timer / headless printer

The worker is the only thread that touches readers and calls the session's input methods;
watchers only enqueue; front ends only drain the sink and query the (thread-safe) session.
``stop()`` stops the children (TERM, then KILL after the grace period), the watchers and the
worker, in that order, from any thread but the worker's own — and never waits on a thread from
inside a callback that thread is blocked in.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from layerwatch.capture.arrivals import Arrival
from layerwatch.engine.live.gc_tuning import HeapFreezer, settle
from layerwatch.engine.live.gil_share import ui_first
from layerwatch.engine.live.side import LiveSide, SideSpec
from layerwatch.engine.readers import ReaderUpdate
from layerwatch.engine.seam import QueueSink, ResultBatch, RunStatus
from layerwatch.engine.session.core import CompareSession

SIDES = ("golden", "target")
FLUSH_S = 0.08
"""Seconds between session flushes while things land (the TUI drains at 10-20 Hz)."""
MAX_BATCH = 2000
"""Arrivals handled per worker round before flushing (keeps batches and latency small)."""


class LivePipeline:
    """``ComparisonSource`` for ``run``/``watch``/``open``/``demo``: two sides, one session."""

    def __init__(
        self,
        golden: SideSpec | None,
        target: SideSpec,
        *,
        session: CompareSession | None = None,
        poll: bool | None = None,
        poll_interval: float = 0.25,
        session_factory: Callable[[], CompareSession] | None = None,
    ) -> None:
        self.sink = QueueSink()
        self.session = session or (session_factory or CompareSession)()
        self.view = self.session
        self.sides = {
            name: LiveSide(name, spec)
            for name, spec in (("golden", golden), ("target", target))
            if spec is not None
        }
        """No golden side: a scan of the target alone (``session`` is then a ScanSession)."""
        self._poll = poll
        self._interval = poll_interval
        self._arrivals: queue.SimpleQueue[Arrival | None] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._stop = threading.Event()
        self._stop_lock = threading.Lock()
        self._stopped = False
        self.done = threading.Event()
        """Set once both sides finished and everything was compared (the last batch is sent)."""
        self.error: str | None = None
        """Why the worker gave up (a bug), if it did."""
        self._state: tuple[object, ...] | None = None
        self._runs: dict[str, RunStatus] = {}
        self._notes: list[str] = []
        self._finished_sent: set[str] = set()
        self._flushing = False
        """True while the worker is inside ``session.flush`` (a failure there is not retried)."""
        self.notes: list[str] = []
        """Every note the pipeline itself sent (crashed commands, removed directories...)."""
        self.freeze_heap = False
        """Keep the garbage collector's full collections short (:mod:`.gc_tuning`): a
        process-wide setting, so only a front end that owns the process turns it on (before
        ``start()``)."""
        self._freezer: HeapFreezer | None = None
        self.share_gil = False
        """Hand the GIL back to a UI thread within ~1 ms while the worker runs, and leave
        full collections to the freezer (:mod:`.gil_share`): process-wide like
        ``freeze_heap``, so only a front end with a UI thread that owns the process turns it
        on (before ``start()``); put back when the worker ends."""
        from layerwatch.engine.session.ranks import spread_for

        self._spread = spread_for(golden.dir, target.dir) if golden is not None else None
        """A single-card golden against a tensor-parallel target: the golden per target rank
        (engine/session/ranks.py); ``None`` otherwise."""

    # --- ComparisonSource ------------------------------------------------------------------
    def start(self) -> None:
        """Launch commands, start watchers and the worker; returns at once. A command that
        cannot start raises :class:`LayerwatchError` after stopping what was started."""
        if self._worker is not None or self._stopped:
            return
        try:
            for side in self.sides.values():
                side.start(self._arrivals, poll=self._poll, interval=self._interval)
        except BaseException:
            self.stop()
            raise
        if self.freeze_heap:
            settle()  # the start-up heap (imports, the TUI's widgets) is never walked again
            self._freezer = HeapFreezer()
        self._worker = threading.Thread(target=self._run, name="layerwatch-engine", daemon=True)
        self._worker.start()

    def stop(self) -> None:
        """Children first (so they write no more), then watchers, then the worker. Idempotent."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
        stoppers = [threading.Thread(target=s.stop, daemon=True) for s in self.sides.values()]
        for thread in stoppers:  # both children get their grace period at the same time
            thread.start()
        for thread in stoppers:
            thread.join()
        self._stop.set()
        self._arrivals.put(None)
        worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            worker.join(timeout=30)
        self.session.close()

    def export(self, path: str) -> str:
        own = getattr(self.session, "export", None)  # a ScanSession writes scan's report
        if own is not None:
            return str(own(path))
        from layerwatch.engine.outcome import write_report

        return write_report(path, self.session)

    @property
    def failed_commands(self) -> list[str]:
        """Launched commands that ended badly (non-zero exit, killed), in words."""
        return [
            f"{side.name} command {side.child.describe()}"
            for side in self.sides.values()
            if side.child is not None and side.child.poll() not in (None, 0)
        ]

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done (both sides finished and compared); ``False`` on timeout."""
        return self.done.wait(timeout)

    # --- the worker ------------------------------------------------------------------------
    def _run(self) -> None:
        turns = (
            ui_first(freezer_collects=self._freezer is not None)
            if self.share_gil
            else contextlib.nullcontext()
        )
        try:
            with turns:  # the settings are back before ``done`` is set
                self._loop()
        except Exception as exc:  # say so once, keep the results so far, always end
            self._give_up(exc)
        finally:
            self.done.set()

    def _give_up(self, exc: Exception) -> None:
        """The last batch after the worker failed: the reason as one note, ``done=True``.

        The session is flushed once more only when flushing was not what failed (a failing
        pool or metric would fail again, and a front end must never wait for a batch that
        cannot come); otherwise the batch carries the state as it was.
        """
        detail = str(exc).splitlines()[0] if str(exc) else ""
        self.error = f"live pipeline stopped: {type(exc).__name__}{': ' + detail if detail else ''}"
        self._notes.append(self.error)
        self.notes.append(self.error)
        batch: ResultBatch | None = None
        if not self._flushing:
            try:
                batch = self.session.flush()
            except Exception:  # the first error is the one to report
                batch = None
        if batch is None:
            batch = self._state_batch()
        self._send(replace(batch, done=True))

    def _state_batch(self) -> ResultBatch:
        """The session's current findings without comparing anything (no flush)."""
        try:
            session = self.session
            return ResultBatch(
                summary=session.summary,
                first_failure=session.first_failure,
                root_cause=session.root_cause,
                first_bad_token=session.first_bad_token,
            )
        except Exception:  # even the state is unreadable: say only why
            return ResultBatch()

    def _loop(self) -> None:
        next_flush = time.monotonic()
        dirty = True
        while not self._stop.is_set():
            reading = any(side.chunked for side in self.sides.values())
            batch = self._take(
                timeout=0.0
                if reading  # a finished dump is being read a part a round: no waiting
                else max(0.0, min(FLUSH_S, next_flush - time.monotonic())) or 0.02
            )
            if batch is None:
                return
            by_side: dict[str, list[Arrival]] = {}
            for arrival in batch:
                by_side.setdefault(arrival.side, []).append(arrival)
            for name, side in self.sides.items():
                updates = side.ingest(by_side.get(name, []))
                more, finish = side.tick()
                for update in updates + more:
                    for to, part in self._route(name, update):
                        self.session.add_update(to, part)
                    dirty = True
                if finish or (side.finished and name not in self._finished_sent):
                    self._finished_sent.add(name)
                    for to, part in self._route(name, None):
                        self.session.add_update(to, part)
                    self.session.finish(name)
                    side.stop_watching()
                    dirty = True
                self._collect(side)
            if self._spread is not None:  # the target's records released golden ones
                self._collect(self.sides["golden"])
            if batch:
                dirty = True
            now = time.monotonic()
            if (dirty or self._runs or self._notes) and (now >= next_flush or reading):
                self._flushing = True
                result = self.session.flush()
                self._flushing = False
                if self._freezer is not None:
                    self._freezer.tick()
                dirty = False
                next_flush = now + FLUSH_S
                floor = getattr(self.session, "settled_floor", None)
                if floor is not None and self._spread is None:
                    below = floor()
                    for side in self.sides.values():
                        side.forget_before(below)
                self._send(result)
                if result.done:
                    return

    def _route(self, name: str, update: ReaderUpdate | None) -> list[tuple[str, ReaderUpdate]]:
        """``update`` of side ``name`` (``None``: that side finished) as the session gets it:
        itself, or with a TP target the golden per rank (:class:`RankSpread`)."""
        spread = self._spread
        if spread is None:
            return [] if update is None else [(name, update)]
        if update is None:
            golden, target = spread.finish(name)
        else:
            golden, target = spread.feed(name, update.tensors)
        parts = {
            "golden": ReaderUpdate(tensors=golden),
            "target": ReaderUpdate(tensors=target, notes=spread.take_notes()),
        }
        if update is not None:
            update.tensors = parts[name].tensors
            update.notes.extend(parts[name].notes)
            parts[name] = update
        return [(side, part) for side, part in parts.items() if part]

    def _take(self, timeout: float) -> list[Arrival] | None:
        """Up to MAX_BATCH arrivals (waiting at most ``timeout`` for the first); None = stop."""
        items: list[Arrival] = []
        try:
            first = self._arrivals.get(timeout=timeout)
        except queue.Empty:
            return items
        if first is None:
            return None
        items.append(first)
        while len(items) < MAX_BATCH:
            try:
                item = self._arrivals.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._arrivals.put(None)
                break
            items.append(item)
        return items

    def _collect(self, side: LiveSide) -> None:
        tokens, tensors = self.session.progress().get(side.name, (0, 0))
        status = side.status(tokens, tensors)
        if status is not None:
            self._runs[side.name] = status
        if side.notes:
            notes = [f"{side.name}: {note}" for note in side.notes]
            self._notes.extend(notes)
            self.notes.extend(notes)
            side.notes.clear()

    def _send(self, batch: ResultBatch) -> None:
        """Add run statuses and our notes to the session's batch; send it if it says anything."""
        state = (batch.summary, batch.first_failure, batch.root_cause, batch.first_bad_token)
        if self._runs or self._notes:
            batch = replace(
                batch, runs={**batch.runs, **self._runs}, notes=[*self._notes, *batch.notes]
            )
            self._runs, self._notes = {}, []
        if (
            batch.cells
            or batch.pairs
            or batch.blocks is not None
            or batch.notes
            or batch.runs
            or batch.done
            or state != self._state
        ):
            self._state = state
            self.sink.on_batch(batch)


def attach_spec(path: str | Path, *, idle_s: float = 30.0, watch: bool = True) -> SideSpec:
    return SideSpec(Path(path).absolute(), None, idle_s, watch)
