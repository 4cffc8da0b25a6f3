"""The grid cells of a live session's settled tokens as numpy columns, not an object a cell.

A 32 768-token run of an 80-layer model has ~3.6 M cells; as :class:`~.seam.CellUpdate`
objects (a frozen dataclass and its tuple of worst metrics, plus the dict entry) that is ~300
bytes a cell, ~1 GB. Here a cell is one row of :data:`CELL` (61 bytes): its state, its worst
grid metrics (float64, so a cell equals the one the whole-run session aggregates), its pair
and failure counts and the store row of its first failure. A token settles once and whole,
so its cells are one run of rows, sorted by block, found through :attr:`CellTable.ranges`.
A :class:`~.seam.CellUpdate` is built only when a cell is asked for (:meth:`CellTable.get`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
from layerwatch.engine.records import GRID_METRICS
from layerwatch.engine.seam import CellState, CellUpdate

CELL = np.dtype(
    [
        ("block", "<i4"),
        ("state", "i1"),
        ("pairs", "<i4"),
        ("failed", "<i4"),
        ("worst", "<f8", (len(GRID_METRICS),)),
        ("first", "<i8"),
    ]
)
"""One settled cell. ``first``: the store row of its first failing pair (report order), -1
when none."""
_EMPTY = (math.nan,) * len(GRID_METRICS)
GROW_MIN = 1024
"""Cells added at least at a growth (a token of a big model has a few hundred)."""


class CellTable:
    """Settled cells, a growable array (by a quarter, in place where it can: :meth:`_grow`)."""

    def __init__(self, capacity: int = 1024) -> None:
        self._rows = np.zeros(capacity, CELL)
        self._n = 0
        self.ranges: dict[int, tuple[int, int]] = {}
        """Token → its cells' rows ``[start, stop)``, sorted by block."""

    def __len__(self) -> int:
        return self._n

    @property
    def nbytes(self) -> int:
        return self._rows.nbytes

    def add_token(self, token: int, cells: list[tuple[CellUpdate, int]]) -> None:
        """``token``'s cells (aggregates of its settled pairs, ``first_bad`` unset) with the
        store row of each one's first failure (-1: none)."""
        cells = sorted(cells, key=lambda c: c[0].block)
        need = self._n + len(cells)
        if need > len(self._rows):
            self._grow(max(need, len(self._rows) + len(self._rows) // 4 + GROW_MIN))
        start = self._n
        for i, (cell, first) in enumerate(cells, start):
            self._rows[i] = (
                cell.block,
                int(cell.state),
                cell.pairs,
                cell.failed,
                cell.worst,
                first,
            )
        self._n = need
        self.ranges[token] = (start, need)

    def _grow(self, size: int) -> None:
        """Room for ``size`` cells, in place (``realloc``; numpy zero-fills the new rows, so
        they are resident at once). Growing by a quarter: a doubling copy held the old and the
        new table together, a peak of ~3× the cells (3.6 M cells of the 32 768 × 2 000
        session: ~660 MB for 220 MB of cells); in place the table is ≤ 1.25× its cells, with
        no peak beside it. While a view of the rows is alive (a reader on another thread)
        numpy refuses to move them: then a copy (a fresh, lazily zeroed array)."""
        try:
            self._rows.resize(size, refcheck=True)
        except ValueError:
            grown = np.zeros(size, CELL)
            grown[: self._n] = self._rows[: self._n]
            self._rows = grown

    def _find(self, token: int, block: int) -> int:
        span = self.ranges.get(token)
        if span is None:
            return -1
        start, stop = span
        blocks = self._rows["block"][start:stop]
        at = int(np.searchsorted(blocks, block))
        return start + at if at < len(blocks) and blocks[at] == block else -1

    def __contains__(self, cell: object) -> bool:
        return isinstance(cell, tuple) and self._find(*cell) >= 0

    def get(self, cell: tuple[int, int]) -> CellUpdate | None:
        """The settled cell ``(token, block)`` as a CellUpdate, None when it has none."""
        i = self._find(*cell)
        return None if i < 0 else self._update(cell[0], i)

    def first_row(self, cell: tuple[int, int]) -> int:
        """The store row of the cell's first failing pair (-1: none, or no such cell)."""
        i = self._find(*cell)
        return -1 if i < 0 else int(self._rows["first"][i])

    def _update(self, token: int, i: int) -> CellUpdate:
        row = self._rows[i]
        worst = tuple(float(v) for v in row["worst"]) if row["pairs"] else _EMPTY
        return CellUpdate(
            token,
            int(row["block"]),
            CellState(int(row["state"])),
            worst,
            int(row["pairs"]),
            int(row["failed"]),
        )

    def cells_of(self, token: int) -> Iterator[CellUpdate]:
        start, stop = self.ranges.get(token, (0, 0))
        for i in range(start, stop):
            yield self._update(token, i)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        """Every settled cell's ``(token, block)`` (builds a tuple a cell: for rare walks)."""
        blocks = self._rows["block"]
        for token, (start, stop) in self.ranges.items():
            for i in range(start, stop):
                yield (token, int(blocks[i]))
