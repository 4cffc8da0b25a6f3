"""What the app knows about the comparison besides the grid: merged from result batches.

Batches carry the *current* value of their state fields (summary, findings, run states), so
merging a tick's batches is "last one wins"; only cells, pairs and notes accumulate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from layerwatch.engine.records import COSINE, STAT_METRICS
from layerwatch.engine.seam import (
    BlockInfo,
    CellUpdate,
    Divergence,
    Finding,
    ResultBatch,
    RunStatus,
    Summary,
)

STAT_L2 = STAT_METRICS[3]
"""``l2norm_stat_relative_error``: present on every statistics-only pair."""


@dataclass
class Tick:
    """What one drain brought, for the widgets to decide what to repaint."""

    cells: list[CellUpdate] = field(default_factory=list)
    blocks: tuple[BlockInfo, ...] | None = None
    notes: list[str] = field(default_factory=list)
    status_changed: bool = False
    first_failure_changed: bool = False
    finished: bool = False
    """The comparison completed during this tick (both sides done, everything compared)."""


@dataclass
class RunState:
    summary: Summary = field(default_factory=Summary)
    runs: dict[str, RunStatus] = field(default_factory=dict)
    first_failure: Finding | None = None
    root_cause: Finding | None = None
    first_bad_token: int | None = None
    divergence: Divergence | None = None
    done: bool = False
    notes: list[str] = field(default_factory=list)
    pairs_seen: int = 0
    stats_only_tokens: set[int] = field(default_factory=set)
    """Tokens with pairs judged from statistics alone (statistics-first or ``--stats-only``
    dumps: msit's ``-st`` figures, no cosine): the status line says so."""

    def merge(self, batches: Sequence[ResultBatch]) -> Tick:
        tick = Tick()
        for batch in batches:
            tick.cells.extend(batch.cells)
            if batch.blocks is not None:
                tick.blocks = batch.blocks
            tick.notes.extend(batch.notes)
            self.pairs_seen += len(batch.pairs)
            known = len(self.stats_only_tokens)
            self.stats_only_tokens.update(
                p.key.token for p in batch.pairs if STAT_L2 in p.metrics and COSINE not in p.metrics
            )
            tick.status_changed |= len(self.stats_only_tokens) != known
            before = (self.first_failure, self.root_cause)
            if batch.summary != self.summary or batch.runs or batch.done != self.done:
                tick.status_changed = True
            self.summary = batch.summary
            self.runs.update(batch.runs)
            self.first_failure = batch.first_failure
            self.root_cause = batch.root_cause
            self.first_bad_token = batch.first_bad_token
            if batch.divergence != self.divergence:
                tick.status_changed = True
            self.divergence = batch.divergence
            tick.finished = tick.finished or (batch.done and not self.done)
            self.done = self.done or batch.done
            if (self.first_failure, self.root_cause) != before:
                tick.first_failure_changed = tick.status_changed = True
        self.notes.extend(tick.notes)
        return tick

    @property
    def failed(self) -> bool:
        """A failure was found (or a launched run crashed): ``run_app`` exits 1, like
        ``compare`` and the headless front ends."""
        s = self.summary
        crashed = any(
            r.state == "crashed" or (r.state == "exited" and r.exit_code not in (None, 0))
            for r in self.runs.values()
        )
        return self.first_failure is not None or s.failed > 0 or s.error > 0 or crashed
