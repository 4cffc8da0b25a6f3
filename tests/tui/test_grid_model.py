"""The grid's numpy model: batches applied in one call, jumps, filters, metric switches."""

from __future__ import annotations

import math

import numpy as np
from layerwatch.engine.records import COSINE, MAX_ABS
from layerwatch.engine.seam import BlockInfo, CellState, CellUpdate
from layerwatch.tui import palette
from layerwatch.tui.grid_model import GridModel

BLOCKS = (
    BlockInfo(0, "embed", "pre", "root.model.embed_tokens"),
    BlockInfo(1, "L0", "layer", "root.model.layers.0"),
    BlockInfo(2, "L1", "layer", "root.model.layers.1"),
    BlockInfo(3, "norm", "post", "root.model.norm"),
    BlockInfo(4, "lm_head", "post", "root.lm_head"),
)


def cell(
    t: int, b: int, state: CellState = CellState.PASS, cos: float = 0.99999, **kw
) -> CellUpdate:
    return CellUpdate(
        t, b, state, (cos, 1e-3, 2e-2, 1e-4), kw.pop("pairs", 3), kw.pop("failed", 0), **kw
    )


def model_with(cells: list[CellUpdate]) -> GridModel:
    model = GridModel(capacity=2)
    model.set_blocks(BLOCKS)
    model.apply(cells)
    return model


def test_apply_returns_changed_rows_and_grows() -> None:
    model = GridModel(capacity=2)
    model.set_blocks(BLOCKS)
    changed = model.apply([cell(0, 0), cell(9, 4), cell(9, 1)])
    assert changed.rows.tolist() == [0, 9]
    assert sorted(zip(changed.tokens.tolist(), changed.blocks.tolist(), strict=True)) == [
        (0, 0),
        (9, 1),
        (9, 4),
    ]
    assert model.n_tokens == 10
    assert model.state.shape[0] >= 10
    assert model.state[9, 4] == CellState.PASS
    assert model.state[5, 2] == CellState.EMPTY


def test_later_update_of_the_same_cell_wins() -> None:
    model = model_with(
        [cell(1, 2, CellState.WAITING), cell(1, 2, CellState.FAIL, cos=0.9), cell(1, 3)]
    )
    assert model.state[1, 2] == CellState.FAIL
    info = model.cell(1, 2)
    assert info is not None and math.isclose(info.values[COSINE], 0.9, rel_tol=1e-6)


def test_cosine_keeps_its_nines_in_float32() -> None:
    model = model_with([cell(0, 1, cos=0.9999999)])
    info = model.cell(0, 1)
    assert info is not None
    assert (
        1 - info.values[COSINE] == np.float32(1e-7) or abs(1 - info.values[COSINE] - 1e-7) < 1e-12
    )


def test_row_version_bumps_only_for_touched_rows() -> None:
    model = model_with([cell(0, 0), cell(1, 0)])
    before = model.row_version[:2].copy()
    model.apply([cell(1, 1)])
    assert model.row_version[0] == before[0]
    assert model.row_version[1] == before[1] + 1


def test_unknown_blocks_get_placeholder_columns() -> None:
    model = GridModel()
    model.apply([cell(0, 3)])
    assert model.n_blocks == 4
    assert len(model.visible) == 4


def test_next_and_previous_failure_in_reading_order() -> None:
    model = model_with(
        [
            cell(0, 0),
            cell(1, 3, CellState.FAIL, cos=0.9),
            cell(2, 1, CellState.ERROR),
            cell(2, 2, CellState.DIVERGED),
            cell(3, 0, CellState.NONFINITE),
        ]
    )
    assert model.next_failure(0, 0, 1) == (1, 3)
    assert model.next_failure(1, 3, 1) == (2, 1)
    assert model.next_failure(2, 1, 1) == (3, 0)  # the diverged cell is skipped
    assert model.next_failure(3, 0, 1) is None
    assert model.next_failure(3, 0, -1) == (2, 1)
    assert model.next_failure(1, 3, -1) is None


def test_filter_keeps_matching_columns_and_jumps_follow_it() -> None:
    model = model_with([cell(0, 2, CellState.FAIL, cos=0.5), cell(0, 4, CellState.FAIL, cos=0.5)])
    model.set_filter("l1 lm_")
    assert model.visible.tolist() == [2, 4]
    assert model.column_of(4) == 1 and model.column_of(0) is None
    assert model.next_failure(0, 0, 1) == (0, 1)
    model.set_filter("layers.0")  # module names match too
    assert model.visible.tolist() == [1]
    model.set_filter("")
    assert model.visible.tolist() == [0, 1, 2, 3, 4]


def test_metric_switch_recomputes_codes() -> None:
    model = model_with([cell(0, 1, cos=0.999)])
    assert palette.CELL_TEXTS[model.codes[0, 1]].strip() == "3.0"
    model.set_metric(model.metrics.index(MAX_ABS))
    assert palette.CELL_TEXTS[model.codes[0, 1]].strip() == "1.7"  # -log10(0.02)


def test_first_bad_mark_moves_and_reports_rows() -> None:
    model = model_with([cell(2, 1, CellState.FAIL, cos=0.9, first_bad=True)])
    assert model.first_bad == (2, 1)
    assert sorted(model.set_first_bad((1, 3))) == [1, 2]
    info = model.cell(1, 3)
    assert info is not None and info.first_bad
