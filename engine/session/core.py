"""The incremental comparison session: tensors in (both runs, any order), verdicts out.

Everything the session reports is a function of what it has been given, not of the order it
came in: pairs are recomputed whenever the pairing, the logits node or the input ids change,
and the first failure / root cause / cells are derived from the current results (rules in
:mod:`.findings`, :mod:`.cells`, :mod:`.blocks`). The live pipeline calls :meth:`add_update`
and :meth:`flush` from its worker thread; the TUI calls the :class:`~.seam.ResultsView`
methods from the UI thread — one lock guards the state and is never held while tensors load.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast, overload

from layerwatch.capture.tokens import TokenSelection
from layerwatch.engine.records import (
    MARGIN,
    TOP1,
    Locator,
    PairResult,
    TensorKey,
    TensorRecord,
    Topology,
    Verdict,
)
from layerwatch.engine.seam import (
    BlockInfo,
    CellUpdate,
    Divergence,
    Finding,
    ResultBatch,
    Sink,
    Summary,
)
from layerwatch.engine.session import findings
from layerwatch.engine.session.align import align_positions
from layerwatch.engine.session.cells import aggregate, merge_cells, rank_cells, same_cell
from layerwatch.engine.session.findings import part_of
from layerwatch.engine.session.jobs import CompareFn, JobRunner, Work, rejudge
from layerwatch.engine.session.pairing import MappingSpec, Pairer, load_mapping
from layerwatch.engine.session.settled import LineFields, SettledTokens
from layerwatch.engine.session.state import SIDES, SessionState

if TYPE_CHECKING:
    from layerwatch.engine.numerics.thresholds import Thresholds
    from layerwatch.engine.seam import PairDetail

OperatorCheck = Callable[
    [TensorRecord, dict[TensorKey, TensorRecord], Topology | None, dict[str, Locator]], str
]
"""(target record, that call's records, target topology, target weights) → one line or ``""``."""


class CompareSession(SessionState):
    """Pairs golden and target tensors, compares them, keeps first failure, root cause, cells."""

    def __init__(
        self,
        thresholds: object = None,
        mapping: MappingSpec | str | Path | None = None,
        tokens: object = None,
        sink: Sink | None = None,
        jobs: int = 1,
        *,
        auto_map: bool | None = None,
        compare: CompareFn | None = None,
        side_stats: bool = False,
        compact: bool = False,
        spill: str | Path | None = None,
    ) -> None:
        super().__init__()
        self.compact = compact
        if spill is not None:  # settled pairs' full chunks go to a file there (store.py)
            self.settled = SettledTokens(spill)
        if thresholds is None or isinstance(thresholds, str | Path):
            from layerwatch.engine.numerics.thresholds import Thresholds

            thresholds = Thresholds.load(str(thresholds) if thresholds is not None else None)
        if compare is None:
            from layerwatch.engine.numerics.compare import compare_pair

            compare = compare_pair
        if isinstance(mapping, str | Path):
            mapping = load_mapping(mapping)
        self.thresholds = cast("Thresholds", thresholds)
        self.tokens = TokenSelection.of(tokens)
        self._token_filter = self.tokens != TokenSelection.everything()
        self.sink = sink
        self.pairer = Pairer(mapping, auto_map)
        self.runner = JobRunner(compare, thresholds, jobs)
        self.runner.side_stats = side_stats  # statistics of stat-less records (CSV columns)
        self.operator_check: OperatorCheck | None = None
        """The target op's own precheck sentence for the operator view
        (``engine/precheck.precheck_sentence``), set by the front ends that build the session:
        the session sits below the precheck driver."""
        self._flush_lock = threading.Lock()
        self._reuse: dict[tuple[object, ...], PairResult] = {}
        """Raw result per (golden payload, target payload, logits): identical bytes compare once."""

    # --- input -----------------------------------------------------------------------------
    def add_update(self, side: str, update: object) -> None:
        """Take one :class:`~.readers.ReaderUpdate` (tensors, topology, token ids, notes...)."""
        if side not in SIDES:
            raise ValueError(f"side must be 'golden' or 'target', not {side!r}")
        with self._lock:
            topology: Topology | None = getattr(update, "topology", None)
            if topology is not None:
                self._topo[side] = topology
                self._struct_dirty = True
            token_ids = getattr(update, "token_ids", None) or {}
            if token_ids:
                for token, ids in token_ids.items():
                    self._token_ids[side][int(token)] = tuple(ids)
                self._divergence_dirty = True
            weights = getattr(update, "weights", None) or {}
            if weights:
                self._weights[side].update(weights)
                self._struct_dirty = True
            for note in getattr(update, "notes", None) or ():
                self._note(f"{side}: {note}")
            for record in getattr(update, "tensors", None) or ():
                self._add_record(side, record)
            if getattr(update, "complete", False):
                self._finish(side)

    def add_records(self, side: str, records: list[TensorRecord]) -> None:
        """Tensors only (tests and simple callers)."""
        with self._lock:
            for record in records:
                self._add_record(side, record)

    def finish(self, side: str) -> None:
        """``side`` will send nothing more: its missing counterparts become UNPAIRED."""
        with self._lock:
            self._finish(side)

    def compare_finished(
        self,
        golden: object,
        target: object,
        progress: Callable[[int, int], None] | None = None,
        *,
        batch: bool = True,
    ) -> ResultBatch | None:
        """Two finished dumps' updates at once (headless compares): both sides added and
        finished, then everything compared. ``batch=False``: a caller that reads
        :meth:`results` and the findings, not the batch, gets None (:meth:`flush`)."""
        for side, update in (("golden", golden), ("target", target)):
            self.add_update(side, update)
            self.finish(side)
        return self.flush(progress=progress, batch=batch)

    # --- compare ---------------------------------------------------------------------------
    @overload
    def flush(
        self, progress: Callable[[int, int], None] | None = None, *, batch: Literal[True] = True
    ) -> ResultBatch: ...

    @overload
    def flush(
        self, progress: Callable[[int, int], None] | None = None, *, batch: bool
    ) -> ResultBatch | None: ...

    def flush(
        self, progress: Callable[[int, int], None] | None = None, *, batch: bool = True
    ) -> ResultBatch | None:
        """Compare everything pending, push the batch to the sink (if anything changed).
        ``batch=False`` without a sink: no batch is built (None), only the findings — the grid's
        cells and the changed pairs of a batch nobody receives were ~5 % of a small-pair compare
        (bench case (b)); the cells stay dirty, so :meth:`cells` still aggregates them."""
        with self._flush_lock:
            with self._lock:
                self._refresh()
                work_keys = sorted(self._todo, key=_WORK_ORDER)
                work: list[Work] = []  # what really gets compared (aligned, one per payload pair)
                sources: list[Work] = []  # the session's records behind each item of ``work``
                sames: list[tuple[object, ...] | None] = []  # each item's _payload_key
                copies: list[tuple[Work, Work, tuple[object, ...]]] = []
                batch_keys: set[tuple[object, ...]] = set()
                for gkey in work_keys:
                    pair = self._pairs[gkey]
                    source = Work(
                        self._records["golden"][gkey],
                        self._records["target"][pair.tkey],
                        pair.logits,
                    )
                    item = self._aligned(source)
                    same = _payload_key(item)
                    if same is not None and (same in self._reuse or same in batch_keys):
                        copies.append(
                            (source, item, same)
                        )  # the same bytes were (or are being) compared
                        continue
                    if same is not None:
                        batch_keys.add(same)
                    sources.append(source)
                    work.append(item)
                    sames.append(same)
                self._todo.clear()
            report = None
            if progress is not None:
                extra = len(copies)
                report = lambda done, total: progress(done + extra * (done == total), total + extra)  # noqa: E731
            results = self.runner.run(work, report) if work else []
            with self._lock:
                while self.runner.notes:  # the pool could not start: compared inline
                    self._note(self.runner.notes.pop(0))
                for source, same, result in zip(sources, sames, results, strict=True):
                    if same is not None:
                        self._reuse[same] = result
                        if self.compact:
                            self._reuse_at[source.golden.key.token].append(same)
                    self._store(source, result)
                for source, item, same in copies:
                    self._store(source, rejudge(item, self._reuse[same], self.thresholds))
                if not work and not copies:
                    self._refresh()
                if batch or self.sink is not None:
                    built: ResultBatch | None = self._batch()
                else:
                    built = None
                    self._refresh_findings_if_dirty()
                self._settle()
        if built is not None and self.sink is not None and _worth_sending(built):
            self.sink.on_batch(built)
        return built

    def close(self) -> None:
        self.runner.close()

    # --- results ---------------------------------------------------------------------------
    @property
    def first_failure(self) -> Finding | None:
        with self._lock:
            return self._first_failure

    @property
    def root_cause(self) -> Finding | None:
        with self._lock:
            return self._root_cause

    @property
    def first_bad_token(self) -> int | None:
        with self._lock:
            return self._first_bad_token

    @property
    def summary(self) -> Summary:
        with self._lock:
            return self._summary()

    @property
    def notes(self) -> list[str]:
        with self._lock:
            return list(self._notes)

    @property
    def divergence(self) -> Divergence | None:
        """Where the generated tokens part (engine/seam.py's ``Divergence``), or None.

        Stable once the first diverged token landed: later tokens only add to ``not_compared``.
        A prompt that differs at token 0 is no divergence but a mismatch (engine/outcome.py).
        """
        with self._lock:
            at = self._diverge_at
            if not at:
                return None
            golden, target = self._token_ids["golden"][at], self._token_ids["target"][at]
            step = at - 1
            # A tensor whose last axis cannot hold the ids fed is no vocabulary row: the last
            # leaf of a dump without the lm_head (a norm output) must not lend its margin.
            top_id = max(
                (max(ids) for ids in self._token_ids["golden"].values() if ids), default=-1
            )
            raws = [p.raw for p in self._pairs.values() if p.logits and p.gkey.token == step]
            raws += self.settled.logits_at(step)  # judged as they were compared: never diverged
            logits = [
                r
                for r in raws
                if r is not None
                and r.metrics
                and (r.golden is None or r.golden.shape[-1:] > (top_id,))
            ]
            margin: float | None = None
            near_tie: bool | None = None
            if logits:
                flipped = [r for r in logits if r.metrics.get(TOP1, 1.0) < 1.0] or logits
                margin = max(float(r.metrics.get(MARGIN, 0.0)) for r in flipped)
                near_tie = not any(TOP1 in r.failed or MARGIN in r.failed for r in flipped)
            later = {t for side in SIDES for t in self._tokens_seen[side] if t >= at}
            return Divergence(
                token=step,
                golden_id=golden[-1] if golden else -1,
                target_id=target[-1] if target else -1,
                golden_margin=margin,
                near_tie=near_tie,
                not_compared_tokens=tuple(sorted(later)),
                not_compared_pairs=self._counts[Verdict.DIVERGED],
            )

    def settled_floor(self) -> int:
        """Every token below this one is settled (or never had a golden tensor): its
        records will not be needed again, so a reader may forget what it keeps of them."""
        with self._lock:
            live = [t for t in self._keys_at["golden"] if t not in self.settled.ranges]
            if live:
                return min(live)
            return max(self.settled.ranges, default=-1) + 1

    def token_ids(self, side: str) -> dict[int, tuple[int, ...]]:
        """The input ids each token of ``side`` was fed (from its dump's token records)."""
        with self._lock:
            return dict(self._token_ids[side])

    def progress(self) -> dict[str, tuple[int, int]]:
        """Per side: (tokens seen, tensors seen), for status lines."""
        with self._lock:
            return {
                s: (len(self._tokens_seen[s]), len(self._records[s]) + self.settled.tensors[s])
                for s in SIDES
            }

    def results(self) -> list[PairResult]:
        """Every pair and every unpaired tensor, in report order (token, then execution order)."""
        with self._lock:
            out = [p.eff for p in self._pairs.values() if p.eff is not None]
            out.extend(self._unpaired_results())
            out.extend(self.settled.results())
            out.sort(key=findings.report_key)
            return out

    def results_by_token(self) -> Iterator[list[PairResult]]:
        """:meth:`results` a token at a time, in the same order: a report of a long live
        session is written without every PairResult in memory at once."""
        for part in self.report_parts():
            yield part if isinstance(part, list) else self.settled_results(part)

    def report_parts(self) -> Iterator[list[PairResult] | range]:
        """:meth:`results_by_token`, where a token whose pairs are all settled comes as its
        rows of the settled store (a range, for :meth:`settled_results` or
        :meth:`settled_fields`): a CSV report is written from the store's columns."""
        with self._lock:
            live: dict[int, list[PairResult]] = {}
            for r in [p.eff for p in self._pairs.values() if p.eff is not None]:
                live.setdefault(r.key.token, []).append(r)
            for r in self._unpaired_results():
                live.setdefault(r.key.token, []).append(r)
            tokens = sorted(live.keys() | self.settled.ranges.keys())
        for token in tokens:
            with self._lock:
                out = live.pop(token, None)
                rows = self.settled.rows_of(token)
                if out is not None:
                    out.extend(self.settled.results(rows))
            if out is None:  # settled rows alone are stored in report order (``_settle_token``)
                yield rows
                continue
            out.sort(key=findings.report_key)
            yield out

    def settled_results(self, rows: range) -> list[PairResult]:
        """The PairResults of settled ``rows`` (a part of :meth:`report_parts`)."""
        with self._lock:
            return list(self.settled.results(rows))

    def settled_fields(self, rows: range, names: Sequence[str]) -> list[LineFields]:
        """The report-line fields of settled ``rows``, ``names`` their metrics (settled.py)."""
        with self._lock:
            return list(self.settled.line_fields(rows, names))

    def cells(self) -> dict[tuple[int, int], CellUpdate]:
        """The current grid: (token, block) → cell, for every non-empty cell.

        Read-only: the dirty cells are aggregated here but stay dirty, so the next batch still
        sends them to the sink (the TUI's grid is built from the batches alone)."""
        with self._lock:
            table = self.settled.cells
            out = {(c.token, c.block): c for t in table.ranges for c in table.cells_of(t)}
            out.update(self._emitted)
            for cell in self._dirty_cells:
                update, waiting = self._cell_now(cell)
                if update.pairs == 0 and not waiting:
                    out.pop(cell, None)
                else:
                    out[cell] = update
            return out

    def rank_cells(self, rank: int | None) -> tuple[tuple[int, ...], list[CellUpdate]]:
        """(the ranks present, the grid as rank ``rank`` alone colours it; ``None``: the worst
        over all ranks, the usual grid): the TUI's rank selector for tensor-parallel dumps."""
        with self._lock:
            present = self.settled.ranks()
            present.update(p.gkey.rank for p in self._pairs.values() if p.eff is not None)
            present.update(r.key.rank for r in self._unpaired_results())
        cells = self.cells()
        ranks = tuple(sorted(present))
        if rank is None:
            return ranks, list(cells.values())
        results = (r for part in self.results_by_token() for r in part)  # a token at a time
        return ranks, rank_cells(results, rank, cells)

    def block_label(self, block: int) -> str:
        with self._lock:
            blocks = self._layout.blocks
            return blocks[block].label if 0 <= block < len(blocks) else ""

    # --- ResultsView -----------------------------------------------------------------------
    def blocks(self) -> tuple[BlockInfo, ...]:
        with self._lock:
            return self._layout.blocks

    def pairs_in_block(self, token: int, block: int) -> list[PairResult]:
        with self._lock:
            out = []
            for tag, key in self._members.get((token, block), ()):
                result = self._result_of(tag, key)
                if result is not None:
                    out.append(result)
            if token in self.settled.ranges:
                out.extend(self.settled.in_block(token, block))
            out.sort(key=findings.report_key)
            return out

    def inputs_of(self, result: PairResult) -> list[PairResult]:
        with self._lock:
            found = [r for r in self._inputs(result.key) if r is not None]
            if result.key.token in self.settled.ranges:
                found += self.settled.inputs(result.key)
            return sorted(found, key=findings.report_key)

    def explain(self, result: PairResult) -> PairDetail:
        from layerwatch.engine.numerics.explain import explain

        inputs = self.inputs_of(result)  # takes the lock briefly; loading happens without it
        detail = explain(result, self.thresholds, inputs)
        with self._lock:
            topology = (self._topo.get("golden"), self._topo.get("target"))
        detail.weights = findings.weight_rows(*topology, result.key.node)
        differ = findings.weights_differ(*topology, result.key.node)
        if differ and not result:  # a failing op that ran with other weights: say it first
            detail.sentence = f"{differ} · {detail.sentence}" if detail.sentence else differ
        line = self._precheck_line(result)
        if line:
            detail.sentence = f"{detail.sentence} · {line}" if detail.sentence else line
        return detail

    def _precheck_line(self, result: PairResult) -> str:
        """The target op's own precheck when the target has weights (:attr:`operator_check`)."""
        if result.target is None or self.operator_check is None:
            return ""
        from layerwatch.engine.numerics.precheck import CALL_STEMS

        key = result.target.key
        with self._lock:
            side = self._records["target"]
            records = {
                k: side[k]
                for stem in CALL_STEMS
                if (k := TensorKey(key.token, key.node, stem, key.rank)) in side
            }
            if key.token in self.settled.ranges:  # settled pairs keep golden keys
                for r in self.settled.records_at(result.key, "target"):
                    k = TensorKey(key.token, key.node, r.key.stem, key.rank)
                    if r.key.stem in CALL_STEMS and r.target is not None and k not in records:
                        records[k] = r.target
            topology = self._topo.get("target")
            weights = dict(self._weights["target"])
        return self.operator_check(result.target, records, topology, weights)

    # --- internals -------------------------------------------------------------------------
    def _aligned(self, item: Work) -> Work:
        """One run kept only the last position (HF ``generate``'s LM head): compare that one."""
        if item.golden.shape == item.target.shape:
            return item
        cut = align_positions(item.golden, item.target)
        if cut is None:
            return item
        self._note(
            f"{item.golden.key.node}: one run kept only the last position "
            f"({list(item.golden.shape)} vs {list(item.target.shape)}); compared the last position"
        )
        return Work(cut[0], cut[1], item.is_logits)

    def _store(self, item: Work, result: PairResult) -> None:
        pair = self._pairs.get(item.golden.key)
        if (
            pair is None
            or self._records["golden"].get(pair.gkey) is not item.golden
            or self._records["target"].get(pair.tkey) is not item.target
            or pair.logits != item.is_logits
        ):
            return  # superseded while it was being compared; the newer work is queued
        result.is_logits = item.is_logits
        pair.raw = result
        self._set_eff(pair)

    def _refresh_findings(self) -> None:
        settled = self.settled.findings
        tokens = sorted(self._fails.keys() | settled.keys())
        first = cause = None
        for i, token in enumerate(tokens):
            live = [
                r for r in (self._pairs[k].eff for k in self._fails.get(token, ())) if r is not None
            ]
            done = settled.get(token)  # its candidates were taken when the token settled
            if i == 0:
                extra = [self.settled.result(done.first)] if done is not None else []
                first = findings.first_failure(live + extra)
            if done is not None and done.cause >= 0:
                cause = (self.settled.result(done.cause), done.captured)
            else:
                cause = findings.root_cause(live, self._inputs)
            if cause is not None:
                break
        old_first = self._first_failure
        self._first_failure = self._finding(first) if first is not None else None
        if cause is None:
            self._root_cause = None
        else:
            result, captured = cause
            why = (
                "output fails while its inputs pass"
                if captured
                else "output fails; its inputs were not captured"
            )
            differ = findings.weights_differ(
                self._topo.get("golden"), self._topo.get("target"), result.key.node
            )
            if differ:
                why = f"{differ}; {why}"
            self._root_cause = self._finding(result, why)
        if self._logits_seen:
            bad = [t for t, n in self._logits_fails.items() if n > 0]
            self._first_bad_token = min(bad) if bad else None
        else:
            self._first_bad_token = tokens[0] if tokens else None
        new_cell = self._first_cell()
        if old_first is None or self._first_failure is None or new_cell != self._first_bad_cell:
            if self._first_bad_cell is not None:
                self._dirty_cells.add(self._first_bad_cell)
            if new_cell is not None:
                self._dirty_cells.add(new_cell)
        self._first_bad_cell = new_cell

    def _first_cell(self) -> tuple[int, int] | None:
        first = self._first_failure
        if first is None or first.block < 0:
            return None
        return (first.token, first.block)

    def _finding(self, result: PairResult, why: str = "") -> Finding:
        label = (
            self._layout.blocks[result.block].label
            if 0 <= result.block < len(self._layout.blocks)
            else ""
        )
        finding = Finding.of(result, label)
        if why:
            finding = Finding(
                finding.token,
                finding.node,
                finding.stem,
                finding.verdict,
                finding.failed_metrics,
                finding.metrics,
                finding.block,
                finding.block_label,
                f"{why}: {result.reason}" if result.reason else why,
                finding.rank,
            )
        return finding

    def _refresh_findings_if_dirty(self) -> None:
        if self._findings_dirty:
            self._refresh_findings()
            self._findings_dirty = False

    def _batch(self) -> ResultBatch:
        self._refresh_findings_if_dirty()
        cells: list[CellUpdate] = []
        self._refresh_cells(cells)
        pairs = self._changed_results()
        self._changed.clear()
        blocks = self._layout.blocks if self._blocks_changed else None
        self._blocks_changed = False
        notes, self._new_notes = self._new_notes, []
        done = all(self._finished.values()) and not self._todo and self._uncompared() == 0
        return ResultBatch(
            cells=cells,
            pairs=pairs,
            blocks=blocks,
            summary=self._summary(),
            first_failure=self._first_failure,
            root_cause=self._root_cause,
            first_bad_token=self._first_bad_token,
            divergence=self.divergence if self._diverge_at else None,
            notes=notes,
            done=done,
        )

    def _changed_results(self) -> list[PairResult]:
        """The changed members' results in (token, node, stem, tag) order. Where every member
        is a golden key (a batch of compared pairs) they are sorted by a key built in C and
        looked up inline (a lambda and ``_result_of`` a pair were ~3 % of ``open --headless``
        on many small pairs); the order of ties (ranks) is the set's, as the lambda left it."""
        changed = self._changed
        keys = [key for tag, key in changed if tag == "g"]
        if len(keys) != len(changed):
            ordered = sorted(changed, key=lambda m: (m[1].token, m[1].node, m[1].stem, m[0]))
            return [r for tag, key in ordered if (r := self._result_of(tag, key)) is not None]
        keys.sort(key=_CHANGED_ORDER)
        get = self._pairs.get
        pairs: list[PairResult] = []
        for key in keys:
            pair = get(key)
            if pair is None:
                result = self._result_of("g", key)
                if result is not None:
                    pairs.append(result)
            elif pair.eff is not None:
                pairs.append(pair.eff)
        return pairs

    def _cell_now(self, cell: tuple[int, int]) -> tuple[CellUpdate, int]:
        """A cell as it is now, its settled row merged in, and its pairs still waiting."""
        results, waiting = self._cell_contents(cell)
        update = aggregate(*cell, results, waiting, cell == self._first_bad_cell)
        return merge_cells(self.settled.cells.get(cell), update), waiting

    def _refresh_cells(self, emit: list[CellUpdate]) -> None:
        for cell in sorted(self._dirty_cells):
            update, waiting = self._cell_now(cell)
            first_bad = cell == self._first_bad_cell
            settled = self.settled.cells.get(cell)
            shown = self._emitted.get(cell, settled if self._table_shown else None)
            if update.pairs == 0 and not waiting:
                if shown is not None:
                    self._emitted.pop(cell, None)
                    emit.append(update)
                continue
            if not same_cell(shown, update):
                emit.append(update)
            if (
                settled is not None
                and not first_bad
                and cell not in self._members
                and same_cell(settled, update)
            ):
                self._emitted.pop(cell, None)  # the settled table's row is what is shown
            else:
                self._emitted[cell] = update
        self._dirty_cells.clear()
        self._table_shown = True

    def _cell_contents(self, cell: tuple[int, int]) -> tuple[list[PairResult], int]:
        results: list[PairResult] = []
        waiting = 0
        for tag, key in self._members.get(cell, ()):
            if tag == "g":
                pair = self._pairs.get(key)
                if pair is not None:
                    if pair.eff is None:
                        waiting += 1
                    else:
                        results.append(pair.eff)
                elif not self._finished["target"]:
                    waiting += 1
            elif not self._finished["golden"]:
                waiting += 1
        return results, waiting

    def _result_of(self, tag: str, key: TensorKey) -> PairResult | None:
        if tag == "g":
            pair = self._pairs.get(key)
            if pair is not None:
                return pair.eff
            if self._finished["target"] and key in self._gonly:
                return self._unpaired("golden", key)
            return None
        if self._finished["golden"] and key in self._tonly:
            return self._unpaired("target", key)
        return None

    def _unpaired_results(self) -> list[PairResult]:
        out: list[PairResult] = []
        if self._finished["target"]:
            out.extend(self._unpaired("golden", k) for k in self._gonly)
        if self._finished["golden"]:
            out.extend(self._unpaired("target", k) for k in self._tonly)
        return out

    def _unpaired(self, side: str, key: TensorKey) -> PairResult:
        record = self._records[side][key]
        if side == "golden":
            reason = "only in the golden run: the target has no tensor that pairs with it"
            gnode = key.node
        else:
            mapped = self._tmap.get(key)
            gnode = mapped.node if mapped is not None else key.node
            hint = (
                f" (looked for {mapped.node} {mapped.stem})"
                if mapped is not None and mapped != key
                else ""
            )
            reason = f"only in the target run: no golden tensor pairs with it{hint}"
        return PairResult(
            key,
            Verdict.UNPAIRED,
            reason=reason,
            golden=record if side == "golden" else None,
            target=record if side == "target" else None,
            order=self._order_of(side, record),
            node_type=record.node_type,
            block=self._layout.block_of(gnode, part_of(key.stem)),
        )

    def _uncompared(self) -> int:
        """Pairs without a result yet (every result is counted once in ``_counts``)."""
        return len(self._pairs) + self._n_settled - sum(self._counts.values())

    def _summary(self) -> Summary:
        counts = self._counts
        unpaired = (len(self._gonly) if self._finished["target"] else 0) + (
            len(self._tonly) if self._finished["golden"] else 0
        )
        pending = (0 if self._finished["target"] else len(self._gonly)) + (
            0 if self._finished["golden"] else len(self._tonly)
        )
        pending += self._uncompared()
        return Summary(
            pairs=counts[Verdict.PASS]
            + counts[Verdict.FAIL]
            + counts[Verdict.DIVERGED]
            + counts[Verdict.ERROR],
            passed=counts[Verdict.PASS],
            failed=counts[Verdict.FAIL],
            diverged=counts[Verdict.DIVERGED],
            unpaired=unpaired,
            error=counts[Verdict.ERROR],
            pending=pending,
        )


_CHANGED_ORDER = operator.itemgetter(0, 1, 2)
"""A batch's changed golden keys in (token, node, stem) order (``TensorKey``'s first fields)."""
_WORK_ORDER = operator.attrgetter("token", "node", "stem", "rank")
"""A flush compares its pairs in this order (a key tuple built in C, not by a lambda)."""


def _payload_key(item: Work) -> tuple[object, ...] | None:
    """Pairs reading the very same bytes on both sides (the layerwatch writer stores a tensor
    once when the next module's input is the previous one's output) share their metrics."""
    g, t = item.golden.loc, item.target.loc
    if g is None or t is None:
        return None
    # the locators' fields, not the locators: a tuple of plain values hashes in C, a frozen
    # dataclass through its Python ``__hash__`` (~8 calls a pair, ~4 ms of a 900-pair compare)
    return (*_fields(g), *_fields(t), item.is_logits)


_fields = operator.attrgetter(*Locator.__slots__)
"""What ``Locator.__eq__`` compares (every field, in order), as a plain tuple: one C call
(a Python function building the tuple cost ~1 µs more a locator, two a pair)."""


def _worth_sending(batch: ResultBatch) -> bool:
    return bool(batch.cells or batch.pairs or batch.blocks is not None or batch.notes or batch.done)
