"""The scan as a live grid: what the pipeline drives when there is no golden run.

``layerwatch run``/``watch`` with only a target (and ``dump --scan`` in a terminal) show the
anomaly scan of engine/scan.py as tensors land. :class:`ScanSession` takes the place of a
``CompareSession`` inside ``LivePipeline`` (same calls: ``add_update``, ``finish``, ``flush``,
``progress``, the findings) and is the ``ResultsView`` for drill-down, so the grid, the block
view and the operator view show scan verdicts unchanged:

* every judged output is a target-only ``PairResult``: PASS (no anomaly), FAIL (an anomaly
  appears here or in a nested node), DIVERGED (carried in by an input: shown, not blamed);
  NaN/Inf that appears here counts as a NaN mismatch, so its cell reads ``NaN``;
* cells aggregate as the compare grid's do (engine/session/cells.py); there is no metric to
  colour by, so the front end shows verdicts only (``verdict_only``);
* ``first_failure`` is the scan's own: the first row in execution order where an anomaly
  appears.
"""

from __future__ import annotations

import math
import threading
from typing import Any

from layerwatch.engine.numerics import anomaly
from layerwatch.engine.records import NAN_MISMATCH, PairResult, TensorRecord, Topology, Verdict
from layerwatch.engine.scan import APPEARS, PROPAGATED, Scanner, ScanRow
from layerwatch.engine.scan_rows import position
from layerwatch.engine.seam import (
    BlockInfo,
    Finding,
    MetricCheck,
    PairDetail,
    ResultBatch,
    SideSummary,
    Summary,
)
from layerwatch.engine.session.blocks import BlockLayout, layout_for, topology_from_names
from layerwatch.engine.session.cells import aggregate

SIDE = "target"


class ScanSession:
    """An incremental scan of one side, shaped like the compare session the pipeline drives."""

    verdict_only = True
    """No golden, no metric: the grid colours cells by their verdict alone."""

    def __init__(self, bounds: anomaly.Bounds = anomaly.DEFAULT_BOUNDS) -> None:
        self.scanner = Scanner(bounds=bounds)
        self.scanner.on_call = self._judged
        self.notes: list[str] = []
        self.operator_check: Any = None
        self._lock = threading.Lock()
        self._topology: Topology | None = None
        self._names: dict[str, tuple[str, int]] = {}
        self._layout = BlockLayout((), None)
        self._layout_key: object = None
        self._results: list[PairResult] = []
        self._cells: dict[tuple[int, int], list[PairResult]] = {}
        self._inputs: dict[tuple[int, int, str], list[PairResult]] = {}
        """(rank, token, node) → its inputs' own NaN/Inf state, for "inputs clean, output not"."""
        self._dirty: set[tuple[int, int]] = set()
        self._blocks_changed = False
        self._finished = False
        self._done = False
        self._tokens: set[int] = set()
        self._tensors = 0
        self._first: PairResult | None = None
        self._first_row: ScanRow | None = None
        self._summary = Summary()

    # --- input (the pipeline's worker thread) ------------------------------------------------
    def add_update(self, side: str, update: Any) -> None:
        with self._lock:
            if update.topology is not None:
                self._topology = update.topology
                self.scanner.topology = update.topology
            self.notes.extend(update.notes)
            for rec in update.tensors:
                self._tokens.add(rec.key.token)
                self._names.setdefault(rec.key.node.split("#")[0], (rec.node_type, rec.order))
            self._tensors += len(update.tensors)
            self._refresh_layout()
            self.scanner.add(update.tensors)

    def finish(self, side: str) -> None:
        with self._lock:
            self._finished = True
            self.scanner.finish()

    def flush(self, progress: Any = None) -> ResultBatch:
        """The cells judged since the last flush, the findings; ``done`` once finished."""
        with self._lock:
            blocks = self._layout.blocks if self._blocks_changed else None
            self._blocks_changed = False
            first = self._first
            cells = [
                aggregate(token, block, self._cells[(token, block)], first_bad=self._holds(first, token, block))
                for token, block in sorted(self._dirty)
            ]  # fmt: skip
            self._dirty.clear()
            finding = self._finding(first)
            done = self._finished and not self._done
            self._done = self._done or self._finished
            return ResultBatch(
                cells=cells,
                blocks=blocks,
                summary=self._summary,
                first_failure=finding,
                root_cause=finding,
                first_bad_token=None if first is None else first.key.token,
                done=done,
            )

    def close(self) -> None:
        pass

    def progress(self) -> dict[str, tuple[int, int]]:
        with self._lock:
            return {SIDE: (len(self._tokens), self._tensors)}

    # --- findings ----------------------------------------------------------------------------
    @property
    def summary(self) -> Summary:
        return self._summary

    @property
    def first_failure(self) -> Finding | None:
        with self._lock:
            return self._finding(self._first)

    @property
    def root_cause(self) -> Finding | None:
        return self.first_failure

    @property
    def first_bad_token(self) -> int | None:
        first = self._first
        return None if first is None else first.key.token

    @property
    def divergence(self) -> None:
        return None

    @property
    def report(self) -> Any:
        """The scan's own report (``layerwatch scan``'s JSON/CSV and summary lines)."""
        return self.scanner.report

    def export(self, path: str) -> str:
        from layerwatch.engine.scan_report import write_report

        with self._lock:
            write_report(self.scanner.report, path)
        return path

    def results(self) -> list[PairResult]:
        with self._lock:
            return sorted(self._results, key=lambda r: (r.key.token, r.order, r.key.node))

    # --- ResultsView (any thread) ------------------------------------------------------------
    def blocks(self) -> tuple[BlockInfo, ...]:
        with self._lock:
            return self._layout.blocks

    def pairs_in_block(self, token: int, block: int) -> list[PairResult]:
        with self._lock:
            found = list(self._cells.get((token, block), ()))
        return sorted(found, key=lambda r: (r.order, r.key.node, r.key.stem))

    def inputs_of(self, result: PairResult) -> list[PairResult]:
        key = result.key
        with self._lock:
            return list(self._inputs.get((key.rank, key.token, key.node), ()))

    def explain(self, result: PairResult) -> PairDetail:
        return explain_scan(result, self.scanner.report.bounds, self.inputs_of(result))

    # --- internals (under the lock) -----------------------------------------------------------
    def _refresh_layout(self) -> None:
        topo = self._topology
        key: object = topo if topo is not None else len(self._names)
        if key == self._layout_key:
            return
        self._layout_key = key
        if topo is None:
            topo = topology_from_names(self._names)
        new = layout_for(topo)
        if new.blocks == self._layout.blocks:
            return
        self._layout = new
        self._blocks_changed = True
        self._cells.clear()
        for result in self._results:
            self._place(result)

    def _place(self, result: PairResult) -> None:
        result.block = self._layout.block_of(result.key.node, result.key.part)
        if result.block >= 0:
            cell = (result.key.token, result.block)
            self._cells.setdefault(cell, []).append(result)
            self._dirty.add(cell)

    def _judged(self, node: str, records: list[TensorRecord], rows: list[ScanRow]) -> None:
        """One call judged by the scanner: a result per floating output (clean ones too)."""
        bad = {row.key.stem: row for row in rows}
        s = self._summary
        passed, failed, carried = s.passed, s.failed, s.diverged
        found = (_input_result(rec) for rec in records if rec.key.part == "input")
        inputs = [r for r in found if r is not None]
        if inputs:
            self._inputs[(records[0].key.rank, records[0].key.token, node)] = inputs
        for rec in records:
            if rec.key.part != "output" or not anomaly.is_float(rec.dtype):
                continue
            row = bad.get(rec.key.stem)
            result = _result(rec, row)
            self._results.append(result)
            self._place(result)
            if row is None:
                passed += 1
            elif row.status == PROPAGATED:
                carried += 1
            else:
                failed += 1
            if row is not None and self._earlier(row):
                self._move_first(result)
        self._summary = Summary(
            pairs=passed + failed + carried, passed=passed, failed=failed, diverged=carried
        )

    def _earlier(self, row: ScanRow) -> bool:
        """Would ``row`` be the scan's first failure (engine/scan_rows.py: the first row in
        execution order where an anomaly appears, else the first row)? Kept incrementally:
        asking the report after every call would cost O(rows) each time."""
        best = self._first_row
        if best is not None and (best.status == APPEARS) != (row.status == APPEARS):
            better = row.status == APPEARS
        else:
            better = best is None or position(row) < position(best)
        if better:
            self._first_row = row
        return better

    def _move_first(self, result: PairResult) -> None:
        old = self._first
        self._first = result
        for r in (old, result):
            if r is not None and r.block >= 0:
                self._dirty.add((r.key.token, r.block))

    def _holds(self, first: PairResult | None, token: int, block: int) -> bool:
        return first is not None and (first.key.token, first.block) == (token, block)

    def _finding(self, result: PairResult | None) -> Finding | None:
        if result is None:
            return None
        blocks = self._layout.blocks
        label = blocks[result.block].label if 0 <= result.block < len(blocks) else ""
        return Finding.of(result, label)


def _result(rec: TensorRecord, row: ScanRow | None) -> PairResult:
    stats = rec.stats if row is None else row.stats
    metrics: dict[str, float] = {}
    if stats is not None:
        metrics = {"max": stats.max, "min": stats.min, "nan": stats.nan, "inf": stats.inf}
    if row is not None and row.ratio is not None:
        metrics["ratio"] = row.ratio
    failed: tuple[str, ...] = ()
    if row is None:
        verdict, reason = Verdict.PASS, ""
    elif row.status == PROPAGATED:
        verdict, reason = Verdict.DIVERGED, row.reason()
    else:
        verdict, reason, failed = Verdict.FAIL, row.reason(), row.kinds
        if anomaly.NAN in row.kinds or anomaly.INF in row.kinds:
            metrics[NAN_MISMATCH] = float(row.stats.nan + row.stats.inf)  # the cell reads NaN
    return PairResult(
        rec.key,
        verdict,
        metrics,
        failed,
        reason,
        target=rec,
        order=row.order if row is not None else rec.order,
        node_type=rec.node_type,
    )


def _input_result(rec: TensorRecord) -> PairResult | None:
    """An input's own state from its statistics: NaN/Inf in it is carried into the node."""
    stats = rec.stats
    if stats is None or not anomaly.is_float(rec.dtype):
        return None
    bad = stats.nan or stats.inf
    metrics = {"max": stats.max, "min": stats.min, "nan": stats.nan, "inf": stats.inf}
    verdict = Verdict.FAIL if bad else Verdict.PASS
    reason = f"{stats.nan} NaN, {stats.inf} Inf in this input" if bad else ""
    return PairResult(
        rec.key, verdict, metrics, ("nan",) if bad else (), reason, target=rec, order=rec.order
    )


def explain_scan(
    result: PairResult, bounds: anomaly.Bounds, inputs: list[PairResult]
) -> PairDetail:
    """The operator view of a scanned output: its statistics against the anomaly rules."""
    rec = result.target
    stats = rec.stats if rec is not None else None
    target = SideSummary(rec.dtype, tuple(rec.shape), stats, rec.source) if rec else None
    m = result.metrics
    checks = [
        MetricCheck("NaN count", m.get("nan", math.nan), 0.0, "<=", not m.get("nan")),
        MetricCheck("Inf count", m.get("inf", math.nan), 0.0, "<=", not m.get("inf")),
    ]
    if stats is not None and rec is not None:
        top = anomaly.FINITE_MAX.get(rec.dtype)
        mag = anomaly.magnitude(stats)
        if top:
            checks.append(MetricCheck("magnitude", mag, float(top), "<", mag < top))
        else:
            checks.append(MetricCheck("magnitude", mag, None, "<=", True))
    if "ratio" in m:
        checks.append(
            MetricCheck("jump ratio", m["ratio"], bounds.ratio, "<=", m["ratio"] <= bounds.ratio)
        )
    if result.verdict is Verdict.PASS:
        sentence = "scan: no anomaly (finite, below the dtype's maximum, no jump from its inputs)"
    else:
        sentence = f"scan: {result.reason}"
    return PairDetail(result, None, target, checks, inputs, [], [], "", [], sentence)
