"""The seam's records that only a front end asks for: one operator's drill-in (:class:`PairDetail`
and its parts), a live run's status line (:class:`RunStatus`), a line of the cases list
(:class:`CaseRow`).

Part of the seam (:mod:`layerwatch.engine.seam` names each of them): kept apart only so that a
headless compare, which never drills in, follows no live run and lists no cases, does not build
these seven dataclasses at start-up (each ~1 ms of a ~0.3 s compare of small dumps on the bench
machine, ``python -X importtime``: Python 3.11 compiles every generated method). Plain data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from layerwatch.engine.records import PairResult, Stats


@dataclass(frozen=True, slots=True)
class MetricCheck:
    name: str
    value: float
    limit: float | None
    """The threshold, or ``None`` when the metric is informational only."""
    op: str
    """``">="`` or ``"<="``."""
    passed: bool


@dataclass(frozen=True, slots=True)
class SideSummary:
    dtype: str
    shape: tuple[int, ...]
    stats: Stats | None
    source: str


@dataclass(frozen=True, slots=True)
class WorstElement:
    index: tuple[int, ...]
    golden: float
    target: float
    abs_err: float
    rel_err: float


@dataclass(frozen=True, slots=True)
class WeightRow:
    """One parameter of an operator on both sides, from the fingerprints in topology.json
    (taken at hook time): shows whether a failing op ran with other weights than the golden."""

    name: str
    golden_shape: tuple[int, ...]
    target_shape: tuple[int, ...]
    golden_dtype: str
    target_dtype: str
    golden_norm: float
    target_norm: float
    differ: bool
    """Not equal even after casting the golden to the target's dtype (or another shape)."""


@dataclass(slots=True)
class PairDetail:
    """Everything the operator view shows for one pair. Built on demand (loads both tensors)."""

    result: PairResult
    golden: SideSummary | None
    target: SideSummary | None
    checks: list[MetricCheck]
    inputs: list[PairResult]
    """The node's input pairs at the same token, so "inputs pass, output fails" is visible."""
    histogram_edges: list[float]
    histogram_counts: list[int]
    histogram_label: str
    worst: list[WorstElement]
    sentence: str
    """Why it was flagged (or why it passes), in one sentence."""
    weights: list[WeightRow] = field(default_factory=list)
    """The operator's own parameters on both sides (empty: none, or no fingerprints)."""


# --- a live run's status line ---------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RunStatus:
    """What one side's producer is doing: for the status line. Filled by the live pipeline."""

    side: str
    state: str
    """``waiting`` ``launching`` ``running`` ``exited`` ``crashed`` ``complete`` ``attached``
    ``stopped`` (an attached layerwatch dump that went idle without its end record)."""
    pid: int | None = None
    exit_code: int | None = None
    tokens: int = 0
    tensors: int = 0
    message: str = ""


# --- several cases (prompts) in one dump pair ----------------------------------------------
@dataclass(frozen=True, slots=True)
class CaseRow:
    """One line of the cases list."""

    key: str
    verdict: str
    """``pass``, ``fail``, ``diverged``, ``empty`` or ``unpaired`` (engine/cases.py)."""
    first_bad_token: int | None
    first_failure: str
    """The first failing node (``""`` when none)."""
    pairs: int
    failed: int
