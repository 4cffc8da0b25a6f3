"""``layerwatch open DUMP`` (one dump): the precheck results behind the TUI's seam.

:class:`PrecheckSource` is a :class:`~layerwatch.engine.seam.ComparisonSource` whose rows are
precheck rows (target-only :class:`PairResult` objects), so the grid (token × block, coloured by
the precheck verdict), the block view and the operator view show them unchanged. The precheck
runs once, in a thread, and arrives as one batch.
"""

from __future__ import annotations

import math
import threading
from typing import Any

from layerwatch.capture.atomic import replacing
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.numerics import precheck as ref
from layerwatch.engine.precheck import PrecheckReport, precheck, write_csv
from layerwatch.engine.records import GRID_METRICS, HIGHER_IS_BETTER, PairResult, Verdict
from layerwatch.engine.seam import (
    BlockInfo,
    CellState,
    CellUpdate,
    Finding,
    MetricCheck,
    PairDetail,
    QueueSink,
    ResultBatch,
    SideSummary,
    Summary,
)
from layerwatch.engine.session.blocks import layout_for

_STATE = {Verdict.PASS: CellState.PASS, Verdict.FAIL: CellState.FAIL}


class PrecheckSource:
    """One dump's precheck as a finished comparison (``start`` runs it in a thread)."""

    def __init__(self, path: str, tokens: Any = None) -> None:
        self.path = path
        self.tokens = tokens
        self.sink = QueueSink()
        self.view = self
        self.error: str | None = None
        self.report: PrecheckReport | None = None
        self._blocks: tuple[BlockInfo, ...] = ()
        self._cells: dict[tuple[int, int], list[PairResult]] = {}
        self._thread: threading.Thread | None = None

    # --- ComparisonSource ----------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="layerwatch-precheck", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._thread.join(timeout=5)

    def wait(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
        return self._thread is None or not self._thread.is_alive()

    def export(self, path: str) -> str:
        if self.report is None:
            raise LayerwatchError("the precheck has not finished")
        if not str(path).lower().endswith(".csv"):
            raise LayerwatchError(f"cannot write {path}: the precheck view exports .csv")
        with replacing(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as fh:
            write_csv(self.report.rows, fh)
        return str(path)

    def _run(self) -> None:
        try:
            report = precheck(self.path, tokens=self.tokens)
        except LayerwatchError as exc:
            self.error = str(exc)
            self.sink.on_batch(ResultBatch(notes=[str(exc)], done=True))
            return
        self.report = report
        self.sink.on_batch(self.batch_of(report))

    def batch_of(self, report: PrecheckReport) -> ResultBatch:
        """Cells, blocks, summary and first failure of a finished precheck."""
        layout = layout_for(report.topology)
        self._blocks = layout.blocks
        for row in report.rows:
            row.block = layout.block_of(row.key.node)
            if row.block >= 0:
                self._cells.setdefault((row.key.token, row.block), []).append(row)
        first = report.first_failure
        summary = Summary(
            pairs=len(report.rows),
            passed=sum(r.verdict is Verdict.PASS for r in report.rows),
            failed=len(report.failed),
            error=len(report.errors),
        )
        cells = [
            _cell(token, block, rows, first) for (token, block), rows in sorted(self._cells.items())
        ]
        label = self._blocks[first.block].label if first is not None and first.block >= 0 else ""
        unsupported = sum(report.unsupported.values())
        notes = list(report.notes)
        if unsupported:
            notes.append(f"{unsupported} calls of unsupported operator types were not checked")
        return ResultBatch(
            cells=cells,
            pairs=list(report.rows),
            blocks=self._blocks,
            summary=summary,
            first_failure=None if first is None else Finding.of(first, label),
            root_cause=None if first is None else Finding.of(first, label),
            first_bad_token=None if first is None else first.key.token,
            notes=notes,
            done=True,
        )

    # --- ResultsView ----------------------------------------------------------------------
    def blocks(self) -> tuple[BlockInfo, ...]:
        return self._blocks

    def pairs_in_block(self, token: int, block: int) -> list[PairResult]:
        return sorted(self._cells.get((token, block), []), key=lambda r: (r.order, r.key.node))

    def inputs_of(self, result: PairResult) -> list[PairResult]:
        return []

    def explain(self, result: PairResult) -> PairDetail:
        return explain_row(result)


def explain_row(result: PairResult) -> PairDetail:
    """The operator view of a precheck row: the figures against their limits, in words."""
    m = result.metrics
    checks = [
        MetricCheck(ref.ELEMENT_RATIO, m.get(ref.ELEMENT_RATIO, math.nan), ref.ELEMENT_LIMIT, "<=",
                    m.get(ref.ELEMENT_RATIO, 0.0) <= ref.ELEMENT_LIMIT),
        MetricCheck(ref.NORM_RATIO, m.get(ref.NORM_RATIO, math.nan), ref.NORM_LIMIT, "<=",
                    m.get(ref.NORM_RATIO, 0.0) <= ref.NORM_LIMIT),
    ]  # fmt: skip
    for name in ("relative_euclidean_distance", "norm_relative_error", "cosine_similarity"):
        if name in m:
            checks.append(MetricCheck(name, m[name], None, "<=", True))
    target = None
    if result.target is not None:
        t = result.target
        target = SideSummary(t.dtype, t.shape, t.stats, t.source)
    if result.verdict is Verdict.PASS:
        sentence = "precheck: the output is what the op computes from its own inputs and weights, within rounding"
    elif result.verdict is Verdict.FAIL:
        sentence = f"precheck: {result.reason}"
    else:
        sentence = f"precheck could not recompute this op: {result.reason}"
    return PairDetail(result, None, target, checks, [], [], [], "", [], sentence)


def _cell(token: int, block: int, rows: list[PairResult], first: PairResult | None) -> CellUpdate:
    state = max(_STATE.get(r.verdict, CellState.ERROR) for r in rows)
    worst = []
    for metric in GRID_METRICS:
        values = [r.metrics[metric] for r in rows if metric in r.metrics]
        if not values:
            worst.append(math.nan)
        else:
            worst.append(min(values) if metric in HIGHER_IS_BETTER else max(values))
    failed = sum(r.verdict is Verdict.FAIL for r in rows)
    return CellUpdate(
        token, block, state, tuple(worst), len(rows), failed, any(r is first for r in rows)
    )
