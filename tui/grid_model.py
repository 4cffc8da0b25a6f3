"""The grid's data: numpy arrays of cell state and worst metrics, owned by the UI thread.

Only the timer drain mutates it (:meth:`GridModel.apply`, one vectorised call per tick);
the grid widget reads it to draw the visible cells. No Textual import, so it can be tested
and benchmarked alone. Metrics are stored in *error* form (``1 - cos`` for cosine) as
float32, which keeps the nines that a float32 cosine would round away.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from layerwatch.engine.records import COSINE, GRID_METRICS
from layerwatch.engine.seam import BlockInfo, CellState, CellUpdate

from . import palette

BAD_STATES = (CellState.FAIL, CellState.NONFINITE, CellState.ERROR)
"""States that ``n``/``N`` stop at (diverged cells are shown, not blamed)."""


@dataclass(frozen=True, slots=True)
class CellInfo:
    """One cell as the summary panel shows it."""

    token: int
    block: BlockInfo
    state: CellState
    values: dict[str, float]
    """Worst value of each grid metric, in the metric's own form (cosine as cos)."""
    pairs: int
    failed: int
    first_bad: bool


@dataclass(frozen=True, slots=True)
class Changed:
    """The cells one :meth:`GridModel.apply` call changed (each cell once)."""

    tokens: np.ndarray
    blocks: np.ndarray

    @property
    def rows(self) -> np.ndarray:
        return np.unique(self.tokens)


NOTHING = Changed(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


def _placeholder_block(index: int) -> BlockInfo:
    return BlockInfo(index, f"#{index}", "layer", "")


class GridModel:
    """Tokens × blocks of :class:`CellState`, worst metrics and precomputed colour codes."""

    def __init__(self, metrics: Sequence[str] = GRID_METRICS, capacity: int = 64) -> None:
        self.metrics: tuple[str, ...] = tuple(metrics)
        self.metric_index = 0
        """Which metric colours the grid (``m`` cycles it)."""
        self.verdict_only = False
        """No metric to colour by (the scan grid): cells show their verdict mark."""
        self.blocks: tuple[BlockInfo, ...] = ()
        self.n_tokens = 0
        """Rows in use: the largest token seen + 1."""
        self.first_bad: tuple[int, int] | None = None
        """(token, block) of the first failure, as the engine last reported it."""
        self.parting: int | None = None
        """The step whose logits chose another token (the engine's divergence record)."""
        self.filter_text = ""
        self.visible = np.zeros(0, dtype=np.int64)
        """Block indices shown as columns, in order (all of them unless filtered)."""
        self.column_index = np.zeros(0, dtype=np.int64)
        """Inverse of :attr:`visible`: the column showing each block, -1 when filtered out."""
        self.version = 0
        """Bumped when every cell may look different (metric, filter, columns): clears caches."""
        self._alloc(capacity, 0)

    # --- storage ---------------------------------------------------------------------------
    def _alloc(self, rows: int, cols: int) -> None:
        m = len(self.metrics)
        self.state = np.zeros((rows, cols), dtype=np.int8)
        self.errors = np.full((rows, cols, m), np.nan, dtype=np.float32)
        self.pairs = np.zeros((rows, cols), dtype=np.int32)
        self.failed = np.zeros((rows, cols), dtype=np.int32)
        self.codes = np.zeros((rows, cols), dtype=np.int16)
        self.row_version = np.zeros(rows, dtype=np.int64)
        """Bumped for every row an update touched: part of the grid's strip-cache key."""

    def _grow(self, rows: int, cols: int) -> None:
        old_rows, old_cols = self.state.shape
        if rows <= old_rows and cols <= old_cols:
            return
        new_rows = max(old_rows, 1)
        while new_rows < rows:
            new_rows *= 2
        new_cols = max(cols, old_cols)
        arrays = (self.state, self.errors, self.pairs, self.failed, self.codes, self.row_version)
        self._alloc(new_rows, new_cols)
        for new, old in zip(
            (self.state, self.errors, self.pairs, self.failed, self.codes, self.row_version),
            arrays,
            strict=True,
        ):
            new[tuple(slice(0, n) for n in old.shape)] = old

    @property
    def n_blocks(self) -> int:
        return len(self.blocks)

    # --- updates ---------------------------------------------------------------------------
    def set_blocks(self, blocks: Sequence[BlockInfo]) -> None:
        """Adopt the engine's column list (it only grows or gets relabelled)."""
        blocks = tuple(blocks)
        self._grow(self.state.shape[0], len(blocks))
        self.blocks = blocks
        self._refilter()

    def apply(self, cells: Sequence[CellUpdate]) -> Changed:
        """Apply cell updates (later ones win); return which cells changed."""
        n = len(cells)
        if n == 0:
            return NOTHING
        tokens = np.fromiter((c.token for c in cells), np.int64, n)
        blocks = np.fromiter((c.block for c in cells), np.int64, n)
        keep = (tokens >= 0) & (blocks >= 0)
        if not keep.all():
            cells = [c for c, k in zip(cells, keep, strict=True) if k]
            return self.apply(cells)
        if int(blocks.max()) >= self.n_blocks:
            extra = range(self.n_blocks, int(blocks.max()) + 1)
            self.set_blocks(self.blocks + tuple(_placeholder_block(i) for i in extra))
        self._grow(int(tokens.max()) + 1, self.n_blocks)
        linear = tokens * self.n_blocks + blocks
        last = _last_occurrence(linear)
        if last is not None:
            cells = [cells[i] for i in last]
            tokens, blocks, n = tokens[last], blocks[last], len(last)
        states = np.fromiter((c.state for c in cells), np.int8, n)
        worst = np.array([_fit(c.worst, len(self.metrics)) for c in cells], dtype=np.float64)
        errors = np.empty_like(worst)
        for i, metric in enumerate(self.metrics):
            errors[:, i] = palette.to_error(metric, worst[:, i])
        self.state[tokens, blocks] = states
        self.errors[tokens, blocks] = errors
        self.pairs[tokens, blocks] = np.fromiter((c.pairs for c in cells), np.int32, n)
        self.failed[tokens, blocks] = np.fromiter((c.failed for c in cells), np.int32, n)
        q = self._quantise(errors[:, self.metric_index])
        self.codes[tokens, blocks] = palette.codes_for(states, q)
        rows = np.unique(tokens)
        self.row_version[rows] += 1
        self.n_tokens = max(self.n_tokens, int(rows[-1]) + 1)
        flagged = [(c.token, c.block) for c in cells if c.first_bad]
        if flagged and self.first_bad is None:
            self.set_first_bad(min(flagged))
        return Changed(tokens, blocks)

    def set_first_bad(self, cell: tuple[int, int] | None) -> list[int]:
        """Move the first-failure mark; returns the rows to repaint."""
        old = self.first_bad
        if cell == old:
            return []
        self.first_bad = cell
        rows = [c[0] for c in (old, cell) if c is not None and c[0] < self.state.shape[0]]
        for row in rows:
            self.row_version[row] += 1
        return rows

    def set_parting(self, token: int | None) -> list[int]:
        """Move the mark of the step where the outputs part; returns the rows to repaint."""
        old = self.parting
        if token == old:
            return []
        self.parting = token
        rows = [t for t in (old, token) if t is not None and t < self.state.shape[0]]
        for row in rows:
            self.row_version[row] += 1
        return rows

    def set_metric(self, index: int) -> None:
        """Colour by another grid metric: recompute every code at once."""
        self.metric_index = index % len(self.metrics)
        rows, cols = self.n_tokens, self.n_blocks
        q = self._quantise(self.errors[:rows, :cols, self.metric_index])
        self.codes[:rows, :cols] = palette.codes_for(self.state[:rows, :cols], q)
        self.version += 1

    def _quantise(self, errors: np.ndarray) -> np.ndarray:
        q = palette.quantise(errors)
        if self.verdict_only:
            q[:] = palette.Q_VERDICT
        return q

    @property
    def metric(self) -> str:
        return self.metrics[self.metric_index]

    # --- columns ---------------------------------------------------------------------------
    def set_filter(self, text: str) -> None:
        """Show only blocks whose label or node contains one of the words (case-insensitive)."""
        self.filter_text = text.strip()
        self._refilter()

    def _refilter(self) -> None:
        words = [w for w in self.filter_text.lower().replace(",", " ").split() if w]
        if not words:
            self.visible = np.arange(self.n_blocks, dtype=np.int64)
        else:
            self.visible = np.array(
                [
                    i
                    for i, b in enumerate(self.blocks)
                    if any(w in b.label.lower() or w in b.node.lower() for w in words)
                ],
                dtype=np.int64,
            )
        self.column_index = np.full(self.n_blocks, -1, dtype=np.int64)
        self.column_index[self.visible] = np.arange(len(self.visible))
        self.version += 1

    def column_of(self, block: int) -> int | None:
        """Visible column showing ``block``, or None when the filter hides it."""
        if not 0 <= block < len(self.column_index):
            return None
        col = int(self.column_index[block])
        return col if col >= 0 else None

    # --- queries ---------------------------------------------------------------------------
    def failure_positions(self) -> np.ndarray:
        """Linear (row * visible columns + column) positions of bad cells, in reading order."""
        view = self.state[: self.n_tokens][:, self.visible]
        return np.flatnonzero(np.isin(view, BAD_STATES))

    def next_failure(self, row: int, col: int, step: int) -> tuple[int, int] | None:
        """The next (``step=1``) or previous (``-1``) bad cell after (row, col), no wrap."""
        width = len(self.visible)
        if width == 0:
            return None
        positions = self.failure_positions()
        here = row * width + col
        if step > 0:
            i = int(np.searchsorted(positions, here, side="right"))
            found = positions[i] if i < positions.size else None
        else:
            i = int(np.searchsorted(positions, here, side="left")) - 1
            found = positions[i] if i >= 0 else None
        return None if found is None else divmod(int(found), width)

    def cell(self, row: int, col: int) -> CellInfo | None:
        """The cell at a visible (row, column), for the summary panel."""
        if not (0 <= row < self.n_tokens and 0 <= col < len(self.visible)):
            return None
        block = int(self.visible[col])
        errors = self.errors[row, block].astype(np.float64)
        values = {
            metric: 1.0 - float(err) if metric == COSINE else float(err)
            for metric, err in zip(self.metrics, errors, strict=True)
        }
        return CellInfo(
            token=row,
            block=self.blocks[block],
            state=CellState(int(self.state[row, block])),
            values=values,
            pairs=int(self.pairs[row, block]),
            failed=int(self.failed[row, block]),
            first_bad=self.first_bad == (row, block),
        )


def _fit(values: Sequence[float], n: int) -> Sequence[float]:
    if len(values) == n:
        return values
    return (tuple(values) + (float("nan"),) * n)[:n]


def _last_occurrence(linear: np.ndarray) -> np.ndarray | None:
    """Indices of the last update per cell, in order; None when there are no duplicates."""
    reversed_unique, first_in_reversed = np.unique(linear[::-1], return_index=True)
    if reversed_unique.size == linear.size:
        return None
    return np.sort(linear.size - 1 - first_in_reversed)
