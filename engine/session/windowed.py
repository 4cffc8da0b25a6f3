"""A finished compare of two dumps one window of whole tokens at a time, in bounded memory.

:class:`~.core.CompareSession` holds every record and result until the end (~5 KB a pair);
a 4k-token run of an 80-layer model has millions of pairs. Headless ``compare`` of two finished
dumps needs none of that once a token is judged: every rule of the session is local to a token
(pairing maps a token to itself, leftover stems pair within a (token, node), local verdicts look
at the node's inputs at that token) except the few below, which are merged here from the
windows in token order:

- first failure: the first window's that has one; root cause: the first window's that has one
  (the session walks tokens from the earliest failing one and stops at the first cause);
- first bad token: the earliest logits failure when any window saw logits, else the earliest
  failure;
- divergence (different input ids fed): every window's session gets the token ids read so far,
  so a pair at or after the parting token is DIVERGED in whichever window it lands; the record
  takes its margin from the window that holds the step before and sums what was not compared;
- counts and notes: summed / kept once, in order.

A window closes at :data:`WINDOW_TENSORS` golden tensors or :data:`WINDOW_PAYLOAD` of payload;
when forked children compare it (``JobRunner.meanwhile``), this process reads the next window
meanwhile, so the headers of later tokens are parsed beside the comparing, not after it; a next
window small enough to stay in this process (``JobRunner.stays_inline``) is compared there too,
its rows written after this window's.
Each window is a fresh session sharing one pairer (its weight match is computed once) and one
job runner (one process pool). Its rows go to the report stream as the window completes, the
merged findings and counts take what they need; then the window's records and results are dropped
(no pair is kept: nothing reads a finished compare's pairs back, so its memory does not grow with
them).
Readers hand records over a chunk at a time in token order (``poll_chunk``: a layerwatch index
chunk, an msit or ATB token directory of every rank, a token of every msprobe ``dump.json``
read as a stream). A token closes once every rank of both sides has read past it (:attr:`_Side.top`); a
tensor of a token whose window already closed is compared in a later window and noted.
``prepare`` changes a window's updates before they are compared: the golden spread over a
tensor-parallel target's ranks (engine/session/ranks.py), local to a token as well.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from layerwatch.engine.readers.base import ReaderUpdate
from layerwatch.engine.records import PairResult, Verdict
from layerwatch.engine.seam import BlockInfo, Divergence, Finding, Summary
from layerwatch.engine.session.column_windows import column_windows, open_tables
from layerwatch.engine.session.core import CompareSession

SIDES = ("golden", "target")
WINDOW_TENSORS = 2_048
"""Tensors of the golden side in one window (whole tokens; one token may be more): ~60 MB of
records and results while the window is compared, freed after."""
WINDOW_PAYLOAD = 256 << 20
"""... or fewer once their payloads (both sides) hold this many bytes: such a window is worth
comparing in forked processes while this one reads the next (msit's layout puts the prompt's
tensors, most of a run's bytes, in token 0: bench case (a)'s token 0 holds 464 of its 490 MB)."""
CHUNK_BYTES = 1 << 20
"""Index bytes read a time from each side."""


class ChunkReader(Protocol):
    def poll_chunk(self, limit: int) -> ReaderUpdate | None: ...


class RowSink(Protocol):
    def add(self, results: list[PairResult]) -> None: ...


@dataclass
class _Side:
    reader: ChunkReader
    buffered: dict[int, list[Any]] = field(default_factory=dict)
    """Records by token, not windowed yet."""
    nbytes: dict[int, int] = field(default_factory=dict)
    """Their payload bytes, by token."""
    ids_top: int = -1
    """Highest token of a token line."""
    tops: dict[int, int] = field(default_factory=dict)
    """Highest token of a record, by rank."""
    done: bool = False

    @property
    def top(self) -> int:
        """The token every rank has read up to: the highest seen (records and token lines), or
        with several ranks (a tensor-parallel dump) the lowest of their highest, so no rank's
        tensors of a token arrive after its window closed."""
        if len(self.tops) > 1:
            return min(self.tops.values())
        return max(self.ids_top, max(self.tops.values(), default=-1))


def windows(
    readers: Mapping[str, ChunkReader], window: int | None = None
) -> Iterator[dict[str, ReaderUpdate]]:
    """Both dumps as windows of whole tokens: per window and side, one ReaderUpdate with the
    records of those tokens (the first also carries topology, weights and notes; token ids come
    as they are read). A token closes when both sides have read past it."""
    window = window or WINDOW_TENSORS
    sides = {s: _Side(readers[s]) for s in SIDES}
    extra = {s: ReaderUpdate() for s in SIDES}  # topology, weights, token ids, notes so far
    closed = -1
    while True:
        open_sides = [s for s in sides.values() if not s.done]
        low = min((s.top for s in open_sides), default=0)
        for name, side in sides.items():
            if side.done or side.top > low:
                continue  # read the side that is behind: neither buffers far ahead
            update = side.reader.poll_chunk(CHUNK_BYTES)
            if update is None:
                side.done = True
                continue
            tops, nbytes = side.tops, side.nbytes
            for record in update.tensors:
                key = record.key
                side.buffered.setdefault(key.token, []).append(record)
                if record.loc is not None:
                    nbytes[key.token] = nbytes.get(key.token, 0) + record.loc.nbytes
                if key.token > tops.get(key.rank, -1):
                    tops[key.rank] = key.token
            if update.token_ids:
                side.ids_top = max(side.ids_top, max(update.token_ids))
            held = extra[name]
            held.topology = update.topology or held.topology
            held.weights.update(update.weights)
            held.token_ids.update(update.token_ids)
            held.notes.extend(update.notes)
            held.case_marks.extend(update.case_marks)
        finished = all(s.done for s in sides.values())
        # Tokens below every open side's highest are complete on both sides (index order).
        upto = None if finished else min(s.top for s in sides.values() if not s.done) - 1
        ready = sorted(
            t for t in {t for s in sides.values() for t in s.buffered} if upto is None or t <= upto
        )
        while ready:
            # A side read whole (or a big chunk) leaves many tokens ready: a window at a time.
            size = payload = take = 0
            while take < len(ready) and size < window and payload < WINDOW_PAYLOAD:
                size += max(len(s.buffered.get(ready[take], ())) for s in sides.values())
                payload += sum(s.nbytes.get(ready[take], 0) for s in sides.values())
                take += 1
            if size < window and payload < WINDOW_PAYLOAD and not finished:
                break
            chosen, ready = ready[:take], ready[take:]
            out = {}
            for name, side in sides.items():
                update = ReaderUpdate(
                    topology=extra[name].topology,
                    weights=dict(extra[name].weights),
                    token_ids=dict(extra[name].token_ids),
                    notes=extra[name].notes,
                )
                extra[name].notes = []
                for token in chosen:
                    update.tensors.extend(side.buffered.pop(token, ()))
                    side.nbytes.pop(token, None)
                out[name] = update
            late = [t for t in chosen if t <= closed]
            if late:
                out["golden"].notes.append(
                    f"tensors of token {late[0]} came after its window was compared: "
                    "compared on their own (is the index out of token order?)"
                )
            closed = max(closed, chosen[-1])
            for side in sides.values():
                forget = getattr(side.reader, "forget_before", None)
                if forget is not None:
                    forget(closed + 1)
            yield out
        if finished and not any(s.buffered for s in sides.values()):
            return


class WindowedRun:
    """What a finished windowed compare knows: the merged findings, counts and notes (no
    pair: its rows are already in the report). Quacks like the session for engine/outcome.py
    and ``wording.summary_text`` (summary, findings, divergence, notes, token ids, blocks)."""

    def __init__(self) -> None:
        self.first_failure: Finding | None = None
        self.root_cause: Finding | None = None
        self._logits_bad: int | None = None
        self._any_bad: int | None = None
        self._logits_seen = False
        self._counts: dict[str, int] = dict.fromkeys(
            ("pairs", "passed", "failed", "diverged", "unpaired", "error"), 0
        )
        self._notes: dict[str, None] = {}
        self._token_ids: dict[str, dict[int, tuple[int, ...]]] = {s: {} for s in SIDES}
        self._blocks: tuple[BlockInfo, ...] = ()
        self._divergence: Divergence | None = None
        self.first_error: PairResult | None = None
        self.rows = 0

    # --- merging ------------------------------------------------------------------------------
    def take(self, session: CompareSession, results: list[PairResult]) -> None:
        """Fold one compared window in (its rows were already written)."""
        self.rows += len(results)
        s = session.summary
        for name in self._counts:
            self._counts[name] += getattr(s, name)
        if self.first_failure is None:
            self.first_failure = session.first_failure
        if self.root_cause is None:
            self.root_cause = session.root_cause
        with session._lock:  # the session's own merge inputs (engine/session/core.py)
            logits_seen = session._logits_seen
            logits_bad = [t for t, n in session._logits_fails.items() if n > 0]
            any_bad = list(session._fails)
        self._logits_seen |= logits_seen
        self._logits_bad = _earliest(self._logits_bad, logits_bad)
        self._any_bad = _earliest(self._any_bad, any_bad)
        for note in session.notes:
            self._notes.setdefault(note)
        for side in SIDES:
            self._token_ids[side].update(session.token_ids(side))
        if not self._blocks:
            self._blocks = session.blocks()
        if self.first_error is None:
            self.first_error = next((r for r in results if r.verdict is Verdict.ERROR), None)
        self._merge_divergence(session.divergence)

    def _merge_divergence(self, found: Divergence | None) -> None:
        if found is None:
            return
        old = self._divergence
        if old is None:
            self._divergence = found
            return
        has_margin = old.golden_margin is not None
        self._divergence = Divergence(
            token=old.token,
            golden_id=old.golden_id,
            target_id=old.target_id,
            golden_margin=old.golden_margin if has_margin else found.golden_margin,
            near_tie=old.near_tie if has_margin else found.near_tie,
            not_compared_tokens=tuple(
                sorted(set(old.not_compared_tokens) | set(found.not_compared_tokens))
            ),
            not_compared_pairs=old.not_compared_pairs + found.not_compared_pairs,
        )

    def note(self, text: str) -> None:
        """A note of the whole run (after the windows' own)."""
        self._notes.setdefault(text)

    # --- the session's face -------------------------------------------------------------------
    @property
    def summary(self) -> Summary:
        return Summary(**self._counts)

    @property
    def first_bad_token(self) -> int | None:
        return self._logits_bad if self._logits_seen else self._any_bad

    @property
    def divergence(self) -> Divergence | None:
        return self._divergence

    @property
    def notes(self) -> list[str]:
        return list(self._notes)

    def token_ids(self, side: str) -> dict[int, tuple[int, ...]]:
        return dict(self._token_ids[side])

    def blocks(self) -> tuple[BlockInfo, ...]:
        return self._blocks


def compare_windows(
    readers: Mapping[str, ChunkReader],
    make_session: Callable[[], CompareSession],
    sink: RowSink,
    progress: Callable[[int, int], None] | None = None,
    window: int | None = None,
    run: WindowedRun | None = None,
    prepare: Callable[[ReaderUpdate, ReaderUpdate], None] | None = None,
) -> WindowedRun:
    """Compare two finished dumps window by window; rows go to ``sink`` as each completes.
    ``run``: where the merged results go (a caller stopped part-way still has what landed);
    ``prepare``: changes a window's golden and target updates in place before they are
    compared (the golden spread over a tensor-parallel target's ranks, engine/session/ranks.py)."""
    run = run if run is not None else WindowedRun()
    shared: tuple[Any, Any] | None = None  # the first session's pairer and job runner
    done = 0
    tables = open_tables(readers)  # finished layerwatch dumps: records built a window at a time
    source = (
        column_windows(tables, window or WINDOW_TENSORS)
        if tables is not None
        else windows(readers, window)
    )
    ahead: list[_Ahead] = []
    limit = window or WINDOW_TENSORS
    holding = 0  # golden tensors of the window being compared (its records stay meanwhile)

    def judge(
        updates: dict[str, ReaderUpdate], report: Callable[[int, int], None] | None
    ) -> tuple[CompareSession, list[PairResult]]:
        """One window compared in a fresh session (the run's pairer and job runner)."""
        nonlocal shared, holding
        holding = len(updates["golden"].tensors)
        session = make_session()
        if shared is None:
            shared = (session.pairer, session.runner)
        else:  # one weight match, one process pool for the whole run
            session.pairer, session.runner = shared
        if prepare is not None:
            prepare(updates["golden"], updates["target"])
        session.runner.meanwhile = read_ahead
        session.compare_finished(  # its results are read below, its batch never
            updates["golden"], updates["target"], report, batch=False
        )
        session.runner.meanwhile = None
        return session, session.results()

    def read_ahead() -> None:
        """The next window (or its reading's error, raised in its turn), read while forked
        children compare this one (``JobRunner.meanwhile``): on two cores the headers of the
        next tokens are parsed beside the comparing instead of after it. A next window that
        its runner would compare in this process anyway (``JobRunner.stays_inline``: bench
        case (a)'s last three tokens, 651 small pairs) is compared here too, and its rows
        wait for this window's: its ~50 ms are spent beside the children's comparing. Only
        where both windows together hold no more tensors than one window may (case (a): 217
        + 651): the records and results held at once stay those of one window (many windows
        of 3 000 small pairs, each forked and the next compared ahead, held two windows'
        worth: test_scale_formats' memory a pair went from ~900 B to ~2 000 B)."""
        try:
            updates = next(source, None)
        except Exception as exc:
            ahead.append(_Ahead(None, error=exc))
            return
        runner = shared[1] if shared is not None else None
        if (
            updates is None
            or runner is None
            or holding + len(updates["golden"].tensors) > limit
            or not runner.stays_inline(updates["golden"].tensors, updates["target"].tensors)
        ):
            ahead.append(_Ahead(updates))
            return
        try:
            with runner.alone():  # no fork while this window's children run
                ahead.append(_Ahead(updates, judge(updates, None)))
        except Exception as exc:
            ahead.append(_Ahead(None, error=exc))

    try:
        while True:
            judged = None
            if ahead:
                item = ahead.pop()
                if item.error is not None:
                    raise item.error
                updates, judged = item.updates, item.judged
            else:
                updates = next(source, None)
            if updates is None:
                break
            if judged is None:
                judged = judge(updates, _offset(progress, done) if progress else None)
            elif progress is not None:  # compared ahead, without a progress of its own
                progress(done + len(judged[1]), done + len(judged[1]))
            session, results = judged
            done += len(results)
            sink.add(results)
            run.take(session, results)
            # Dropped before the window after next is read: at most two windows' records at a
            # time (the next one is read while forked children compare this one).
            del session, results, updates, judged
    finally:
        if shared is not None:
            shared[1].close()
    return run


@dataclass
class _Ahead:
    """The next window, read (and maybe compared) while forked children compare this one."""

    updates: dict[str, ReaderUpdate] | None
    judged: tuple[CompareSession, list[PairResult]] | None = None
    """Its session and results when it was compared ahead (rows not written yet)."""
    error: Exception | None = None
    """What reading or comparing it raised: raised in its turn, after this window's rows."""


def _earliest(known: int | None, tokens: list[int]) -> int | None:
    return min([*tokens, known]) if known is not None else min(tokens, default=None)


def _offset(progress: Callable[[int, int], None], base: int) -> Callable[[int, int], None]:
    """A window's ``done/total`` as the run's (pairs of earlier windows counted)."""
    return lambda done, total: progress(base + done, base + total)
