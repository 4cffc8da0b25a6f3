"""``layerwatch open DUMP`` with one dump: the precheck grid and its drill-down in the TUI."""

from __future__ import annotations

import pytest
from layerwatch.engine.precheck_view import PrecheckSource
from layerwatch.engine.seam import CellState
from layerwatch.tui.app import LayerwatchApp
from layerwatch.tui.screens.block import BlockScreen
from layerwatch.tui.screens.operator import OperatorScreen
from support import hf_zoo
from textual.widgets import Static

from .conftest import plain_text, wait_until

pytest.importorskip("transformers")


async def test_single_dump_open_shows_the_precheck_grid_and_the_faulty_op(tmp_path) -> None:
    dump = hf_zoo.capture("llama", tmp_path, dtype="bf16", fault="kernel_scale", dump_weight=True)
    source = PrecheckSource(str(dump))
    app = LayerwatchApp(source, title="layerwatch precheck", color_system="truecolor")
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: source.report is not None and app.state.summary.pairs)
        assert app.state.summary.failed >= 1
        first = app.state.first_failure
        assert (first.token, first.node) == (1, "root.model.layers.1.mlp.down_proj")
        cells = source.batch_of(source.report).cells
        bad = [c for c in cells if c.state is CellState.FAIL]
        assert {(c.token, source.blocks()[c.block].label) for c in bad} >= {(1, "L1")}
        assert all(c.state is CellState.PASS for c in cells if c.token == 0)
        await pilot.press("f", "enter")
        await wait_until(pilot, lambda: isinstance(app.screen, BlockScreen) and app.screen.rows)
        rows = app.screen.rows
        target = next(i for i, r in enumerate(rows) if r.key.node.endswith("mlp.down_proj"))
        app.screen.query_one("DataTable").move_cursor(row=target)
        await pilot.press("enter")
        await wait_until(
            pilot, lambda: isinstance(app.screen, OperatorScreen) and app.screen.detail
        )
        text = plain_text(app.screen.query_one("#detail", Static))
        assert "precheck_norm_ratio" in text and "precheck:" in text
