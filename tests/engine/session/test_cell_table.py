"""The settled cell table grows without holding two copies of its cells (engine/session/cell_table.py)."""

from __future__ import annotations

import tracemalloc

from layerwatch.engine.records import GRID_METRICS
from layerwatch.engine.seam import CellState, CellUpdate
from layerwatch.engine.session.cell_table import CELL, CellTable


def _cells(token: int, n: int) -> list[tuple[CellUpdate, int]]:
    metrics = range(len(GRID_METRICS))
    return [
        (
            CellUpdate(
                token, b, CellState.PASS, tuple(float(token + b + m) for m in metrics), b + 1, b % 3
            ),
            b if b % 3 else -1,
        )
        for b in range(n)
    ]


def _filled(tokens: int, per: int) -> CellTable:
    table = CellTable(capacity=tokens * per)
    for token in range(tokens):
        table.add_token(token, _cells(token, per))
    return table


def _same(table: CellTable, tokens: int, per: int) -> None:
    for token in range(tokens):
        got = list(table.cells_of(token))
        assert got == [cell for cell, _ in _cells(token, per)]
        assert [table.first_row((token, b)) for b in range(per)] == [
            b if b % 3 else -1 for b in range(per)
        ]


def test_growth_holds_one_table_not_two() -> None:
    """Growing a full table of 64 k cells: at the peak the traced bytes are ≤ 1.4× the cells
    held (the table grows in place by a quarter), not the old table beside a doubled one (~3×):
    ~3.6 M cells of the 32 768-token session would otherwise peak at ~660 MB for 220 MB."""
    tokens, per = 64, 1024
    cells = _cells(tokens, per)  # the last token's, made before counting
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        table = _filled(tokens, per)
        assert len(table) == table.nbytes // CELL.itemsize  # full: the next token grows it
        tracemalloc.reset_peak()
        table.add_token(tokens, cells)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    per_cell = (peak - base) / len(table)
    assert per_cell <= 1.4 * CELL.itemsize, f"{per_cell:.1f} B a cell at the peak"
    assert table.nbytes <= 1.3 * len(table) * CELL.itemsize
    _same(table, tokens + 1, per)


def test_growth_with_a_view_alive_copies() -> None:
    """A reader holding a view of the rows (another thread iterating): the rows cannot move,
    so the table copies them; the view still reads the old cells."""
    tokens, per = 4, 256
    table = _filled(tokens, per)
    walk = iter(table)  # holds the block column while suspended
    first = next(walk)
    table.add_token(tokens, _cells(tokens, per))
    assert first == (0, 0) and next(walk) == (0, 1)
    assert len(table) == (tokens + 1) * per
    _same(table, tokens + 1, per)
