"""One operator's drill-in, as the operator screen shows it: :class:`PairDetail` and its parts.

Part of the seam (:mod:`layerwatch.engine.seam` names each of them): kept apart only so that a
headless compare, which never drills in, does not build these five dataclasses at start-up
(each costs ~1 ms of a ~0.3 s compare of small dumps, ``python -X importtime``). Plain data.
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
