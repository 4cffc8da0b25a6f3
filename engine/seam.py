"""The one narrow seam between the engine and whoever shows its results (the TUI, the CLI).

The engine pushes :class:`ResultBatch` objects into a :class:`Sink`; a consumer on another
thread drains them (the TUI with a 10-20 Hz timer, measured to be the only way that keeps
the UI responsive). For drill-down the consumer asks a :class:`ResultsView`, which is
thread-safe. Everything here is plain data: no Textual, no numpy.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any, Protocol

from layerwatch.engine.records import PairResult, Verdict

if TYPE_CHECKING:
    from layerwatch.engine.seam_detail import CaseRow as CaseRow
    from layerwatch.engine.seam_detail import MetricCheck as MetricCheck
    from layerwatch.engine.seam_detail import PairDetail as PairDetail
    from layerwatch.engine.seam_detail import RunStatus as RunStatus
    from layerwatch.engine.seam_detail import SideSummary as SideSummary
    from layerwatch.engine.seam_detail import WeightRow as WeightRow
    from layerwatch.engine.seam_detail import WorstElement as WorstElement


class CellState(IntEnum):
    """State of one grid cell (token × block); larger = worse, so a cell keeps the max."""

    EMPTY = 0
    """Nothing dumped for this block at this token (yet, or ever)."""
    WAITING = 1
    """One side has landed, the other has not yet."""
    PASS = 2
    DIVERGED = 3
    """Inputs differ because an earlier token differed: shown, not blamed."""
    FAIL = 4
    NONFINITE = 5
    """NaN/Inf where the golden run has none (or at other positions)."""
    ERROR = 6
    """A pair could not be compared (shape mismatch, unreadable file)."""


@dataclass(frozen=True, slots=True)
class BlockInfo:
    """One grid column: what runs before the repeated layers, each layer, what runs after."""

    index: int
    label: str
    """Short header text: ``embed``, ``L0``..``L31``, ``norm``, ``lm_head``."""
    kind: str
    """``"pre"``, ``"layer"`` or ``"post"``."""
    node: str
    """Module path that heads the block (``root.model.layers.3``)."""


@dataclass(frozen=True, slots=True)
class CellUpdate:
    """New aggregate for one cell. ``worst`` follows :data:`~.records.GRID_METRICS` order."""

    token: int
    block: int
    state: CellState
    worst: tuple[float, ...]
    """Worst value of each grid metric inside the block (NaN where none yet)."""
    pairs: int
    failed: int
    first_bad: bool = False
    """This cell holds the first failure (earliest token, then earliest in execution order)."""


@dataclass(frozen=True, slots=True)
class Finding:
    """A located result: the first failure or the root cause. ``to_json`` is the CLI's shape."""

    token: int
    node: str
    stem: str
    verdict: Verdict
    failed_metrics: tuple[str, ...]
    metrics: dict[str, float]
    block: int = -1
    block_label: str = ""
    reason: str = ""
    rank: int = 0
    """The target rank (tensor parallel dumps; 0 for a single process)."""

    @classmethod
    def of(cls, result: PairResult, block_label: str = "") -> Finding:
        return cls(
            result.key.token,
            result.key.node,
            result.key.stem,
            result.verdict,
            result.failed,
            dict(result.metrics),
            result.block,
            block_label,
            result.reason,
            result.key.rank,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "token": self.token,
            "node": self.node,
            "tensor": self.stem,
            "rank": self.rank,
            "verdict": self.verdict.value,
            "failed_metrics": list(self.failed_metrics),
            "metrics": dict(self.metrics),
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class Summary:
    """Counts of verdicts so far; ``pending`` = tensors seen on one side only (yet)."""

    pairs: int = 0
    passed: int = 0
    failed: int = 0
    diverged: int = 0
    unpaired: int = 0
    error: int = 0
    pending: int = 0

    def to_json(self) -> dict[str, int]:
        return {
            "pairs": self.pairs,
            "pass": self.passed,
            "fail": self.failed,
            "diverged": self.diverged,
            "unpaired": self.unpaired,
            "error": self.error,
        }


@dataclass(frozen=True, slots=True)
class Divergence:
    """Where the target's generated tokens part from the golden's (``None`` while they agree).

    ``token`` is the step whose logits chose differently: the step before the first token whose
    input ids differ. The ids are the last input id of the next step on each side (the token
    each side generated); ``golden_margin`` is the golden top-1 minus top-2 logit at ``token``
    from its logits pair (engine/numerics/logits.py), ``None`` when logits were not dumped.
    ``near_tie``: the flip passed the logits verdict's margin rule (``golden_top2_margin`` per
    dtype in engine/thresholds.toml), ``None`` without logits. Later steps were fed other
    input: ``not_compared_tokens`` / ``not_compared_pairs`` say how much that left unjudged.
    """

    token: int
    golden_id: int
    target_id: int
    golden_margin: float | None
    near_tie: bool | None
    not_compared_tokens: tuple[int, ...]
    not_compared_pairs: int

    def to_json(self) -> dict[str, Any]:
        return {
            "token": self.token,
            "golden_id": self.golden_id,
            "target_id": self.target_id,
            "golden_margin": self.golden_margin,
            "near_tie": self.near_tie,
            "not_compared": {
                "tokens": list(self.not_compared_tokens),
                "pairs": self.not_compared_pairs,
            },
        }


@dataclass(slots=True)
class ResultBatch:
    """Everything new since the previous batch. State fields always carry the current value."""

    cells: list[CellUpdate] = field(default_factory=list)
    pairs: list[PairResult] = field(default_factory=list)
    blocks: tuple[BlockInfo, ...] | None = None
    """The full column list, only when it changed."""
    summary: Summary = field(default_factory=Summary)
    first_failure: Finding | None = None
    root_cause: Finding | None = None
    first_bad_token: int | None = None
    divergence: Divergence | None = None
    runs: dict[str, RunStatus] = field(default_factory=dict)
    """Latest status per side, only for sides whose status changed."""
    notes: list[str] = field(default_factory=list)
    """One-line messages for the user (a truncated file skipped, a child that exited...)."""
    done: bool = False
    """No more batches will follow: both sides finished and everything was compared."""


class Sink(Protocol):
    """Where the engine delivers batches. Called from the engine's thread."""

    def on_batch(self, batch: ResultBatch) -> None: ...


class QueueSink:
    """A sink that only enqueues; the consumer drains with :meth:`drain` on its own thread."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[ResultBatch] = queue.SimpleQueue()

    def on_batch(self, batch: ResultBatch) -> None:
        self._queue.put(batch)

    def drain(self, limit: int = 1_000_000) -> list[ResultBatch]:
        batches: list[ResultBatch] = []
        while len(batches) < limit:
            try:
                batches.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batches


# --- drill-down ----------------------------------------------------------------------------
# MetricCheck, SideSummary, WorstElement, WeightRow, PairDetail (and RunStatus, CaseRow):
# engine/seam_detail.py, loaded by the first name asked for here (a headless compare never
# drills in, follows no live run and lists no cases).
_DETAIL = frozenset(
    {
        "MetricCheck",
        "SideSummary",
        "WorstElement",
        "WeightRow",
        "PairDetail",
        "RunStatus",
        "CaseRow",
    }
)


def __getattr__(name: str) -> Any:
    if name in _DETAIL:
        from layerwatch.engine import seam_detail

        return getattr(seam_detail, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ResultsView(Protocol):
    """Read access to the session for drill-down. Safe to call from any thread."""

    def blocks(self) -> tuple[BlockInfo, ...]: ...

    def pairs_in_block(self, token: int, block: int) -> list[PairResult]:
        """The block's pairs at ``token`` in execution order (inner operators first)."""
        ...

    def inputs_of(self, result: PairResult) -> list[PairResult]: ...

    def rank_cells(self, rank: int | None) -> tuple[tuple[int, ...], list[CellUpdate]]:
        """(ranks present, every cell as rank ``rank`` alone colours it; ``None``: the worst
        over all ranks). Walks every result: call it off the UI thread."""
        ...

    def explain(self, result: PairResult) -> PairDetail:
        """Load both tensors again and build the operator view. May take a while: call it off
        the UI thread."""
        ...


class ComparisonSource(Protocol):
    """What a front end (TUI, headless printer) drives: a live or finished comparison.

    Implemented by the live pipeline (``engine/live/pipeline.py``) for ``demo``/``run``/``watch``/``open``.
    """

    sink: QueueSink
    view: ResultsView

    def start(self) -> None:
        """Launch children / start watchers and the engine worker. Returns at once."""
        ...

    def stop(self) -> None:
        """Stop launched children cleanly (TERM, then KILL after a grace period) and the
        threads. Idempotent; everything already compared stays available."""
        ...

    def export(self, path: str) -> str:
        """Write the report as ``layerwatch compare -o`` does (``.csv``, ``.json`` or ``.jsonl``
        by suffix; any other suffix raises ``LayerwatchError``)."""
        ...


# --- several cases (prompts) in one dump pair ----------------------------------------------
class CasesView(Protocol):
    """The cases of a per-case dump pair (engine/case_sources.py ``CaseSet``)."""

    rows: list[CaseRow]

    @property
    def failing(self) -> int: ...

    def load(self) -> list[CaseRow]:
        """Compare every case (slow: call it off the UI thread); raises LayerwatchError."""
        ...

    def source(self, key: str) -> ComparisonSource:
        """Case ``key`` as a comparison source; raises LayerwatchError if it cannot be shown."""
        ...

    def close(self) -> None: ...
