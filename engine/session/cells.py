"""One grid cell (token × block) from the pairs inside it: the worst of everything.

A block's value is the worst over every tensor inside it — inner operators included — so a
fault that a residual add hides at the layer output (msit measured: layer cos 0.99994, its mlp
0.9987) still colours the layer's cell.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

from layerwatch.engine.records import (
    GRID_METRICS,
    HIGHER_IS_BETTER,
    NAN_MISMATCH,
    PairResult,
    Verdict,
)
from layerwatch.engine.seam import CellState, CellUpdate

_STATE = {
    Verdict.PASS: CellState.PASS,
    Verdict.FAIL: CellState.FAIL,
    Verdict.DIVERGED: CellState.DIVERGED,
    Verdict.ERROR: CellState.ERROR,
    Verdict.UNPAIRED: CellState.EMPTY,
}
_LOWER_IS_WORSE = tuple(name in HIGHER_IS_BETTER for name in GRID_METRICS)
_GRID = tuple(zip(range(len(GRID_METRICS)), GRID_METRICS, _LOWER_IS_WORSE, strict=True))
"""(column, metric, lower is worse) of each grid metric: one tuple unpacked a metric in
:func:`aggregate`'s loop (it runs ~5 times a pair), not ``enumerate`` and an index."""


def state_of(result: PairResult) -> CellState:
    """Cell state one compared pair contributes (NaN/Inf where the golden has none → NONFINITE)."""
    state = _STATE[result.verdict]
    if state is CellState.FAIL and result.metrics.get(NAN_MISMATCH, 0.0) > 0:
        return CellState.NONFINITE
    return state


def is_failure(result: PairResult) -> bool:
    """Counts against the run: out of threshold or not comparable. Diverged pairs never do."""
    return result.verdict is Verdict.FAIL or result.verdict is Verdict.ERROR


def aggregate(
    token: int, block: int, results: Iterable[PairResult], waiting: int = 0, first_bad: bool = False
) -> CellUpdate:
    """The cell's state (worst :class:`CellState`), worst grid metrics, and counts."""
    state = CellState.WAITING if waiting else CellState.EMPTY
    worst = [math.nan] * len(GRID_METRICS)
    pairs = failed = 0
    for result in results:
        s = state_of(result)
        if s is CellState.EMPTY:
            continue
        pairs += 1
        if s > state:
            state = s
        if is_failure(result):
            failed += 1
        get = result.metrics.get
        for i, name, lower in _GRID:
            value = get(name)
            if value is None or value != value:
                continue
            current = worst[i]
            if current != current or (value < current if lower else value > current):
                worst[i] = float(value)
    return CellUpdate(token, block, state, tuple(worst), pairs, failed, first_bad)


def merge_cells(a: CellUpdate | None, b: CellUpdate) -> CellUpdate:
    """Two aggregates of one cell as one (a live session's settled part and its live part)."""
    if a is None:
        return b
    worst = tuple(
        y if x != x else x if y != y else (min(x, y) if lower else max(x, y))
        for x, y, lower in zip(a.worst, b.worst, _LOWER_IS_WORSE, strict=True)
    )
    return CellUpdate(
        b.token,
        b.block,
        max(a.state, b.state),
        worst,
        a.pairs + b.pairs,
        a.failed + b.failed,
        a.first_bad or b.first_bad,
    )


def same_cell(a: CellUpdate | None, b: CellUpdate) -> bool:
    """Equality that treats NaN == NaN (dataclass equality does not)."""
    if a is None:
        return False
    if (a.state, a.pairs, a.failed, a.first_bad) != (b.state, b.pairs, b.failed, b.first_bad):
        return False
    return all(x == y or (x != x and y != y) for x, y in zip(a.worst, b.worst, strict=True))


def rank_cells(
    results: Iterable[PairResult], rank: int, cells: Iterable[tuple[int, int]]
) -> list[CellUpdate]:
    """Every cell as rank ``rank`` of a tensor-parallel run alone colours it (the TUI's rank
    selector; by default a cell is the worst over all ranks). Cells of ``cells`` where this rank
    has nothing are empty; ``first_bad`` marks this rank's earliest failure."""
    groups: dict[tuple[int, int], list[PairResult]] = defaultdict(list)
    first: tuple[tuple[int, int], tuple[int, int]] | None = None
    for result in results:
        if result.key.rank != rank or result.block < 0:
            continue
        cell = (result.key.token, result.block)
        groups[cell].append(result)
        where = (result.key.token, result.order)
        if is_failure(result) and (first is None or where < first[0]):
            first = (where, cell)
    out = [
        aggregate(t, b, members, first_bad=first is not None and first[1] == (t, b))
        for (t, b), members in groups.items()
    ]
    empty = (math.nan,) * len(GRID_METRICS)
    out += [
        CellUpdate(t, b, CellState.EMPTY, empty, 0, 0) for t, b in cells if (t, b) not in groups
    ]
    return out
