"""Pilot tests: Enter opens the block view, Enter again the operator view, Escape goes back."""

from __future__ import annotations

from layerwatch.tui.grid import LayerGrid
from layerwatch.tui.screens.block import BlockScreen
from layerwatch.tui.screens.main import MainScreen
from layerwatch.tui.screens.operator import OperatorScreen
from textual.widgets import DataTable, Static

from .conftest import make_app, plain_text, wait_until


def table_text(table: DataTable, row: int) -> list[str]:
    return [str(cell) for cell in table.get_row_at(row)]


async def test_block_view_lists_operators_in_order_with_root_cause_marked() -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f", "enter")
        await wait_until(pilot, lambda: isinstance(app.screen, BlockScreen) and app.screen.rows)
        screen = app.screen
        assert (screen.token, screen.block) == (3, 3)
        orders = [p.order for p in screen.rows]
        assert orders == sorted(orders) and len(orders) == 13
        table = screen.query_one(DataTable)
        assert table.cursor_row == 4  # starts on the operator where the error enters
        row = table_text(table, 4)
        assert row[0] == "◆" and row[2] == "self_attn.o_proj"
        assert "root cause" in row[3]
        assert row[4] == "✔ 1"  # its input passes
        assert "0.912 ✖" in row
        after = table_text(table, 5)
        assert after[0] == "✖" and after[4] == "✖ 1/1"  # downstream: the input already fails
        # n/N step through failing operators
        await pilot.press("n")
        assert table.cursor_row == 5
        await pilot.press("N", "N")
        assert table.cursor_row == 4


async def test_operator_view_shows_detail_from_a_worker_and_escape_keeps_cursors() -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f", "enter")
        await wait_until(pilot, lambda: isinstance(app.screen, BlockScreen) and app.screen.rows)
        await pilot.press("j", "enter")
        await wait_until(
            pilot, lambda: isinstance(app.screen, OperatorScreen) and app.screen.detail
        )
        screen = app.screen
        assert screen.result.key.node == "root.model.layers.2.self_attn"
        assert app.source.view.explained == [screen.result.key]
        text = plain_text(screen.query_one("#detail", Static))
        for part in (
            "golden vs target",
            "bfloat16",
            "metrics against thresholds",
            "cosine_similarity",
            "error histogram",
            "worst elements",
            "inputs of this operator",
            "files",
            "golden/cpu_4100/data/00000003.safetensors",
        ):
            assert part in text, part
        await pilot.press("escape")
        await wait_until(pilot, lambda: isinstance(app.screen, BlockScreen))
        assert app.screen.query_one(DataTable).cursor_row == 5
        await pilot.press("escape")
        await wait_until(pilot, lambda: isinstance(app.screen, MainScreen))
        grid = app.screen.query_one(LayerGrid)
        assert (grid.cursor_row, grid.cursor_block) == (3, 3)


async def test_an_empty_cell_opens_an_empty_block_view() -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("G", "end")  # the last token is still waiting on the target there
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, BlockScreen))
        await wait_until(
            pilot, lambda: "operators" in plain_text(app.screen.query_one("#block-title", Static))
        )
        await pilot.press("escape")
        await wait_until(pilot, lambda: isinstance(app.screen, MainScreen))


async def test_explain_failure_is_a_message_not_a_crash() -> None:
    app = make_app()

    def broken(result):
        raise OSError("golden file vanished")

    async with app.run_test(size=(80, 24)) as pilot:
        app.source.view.explain = broken
        await pilot.press("f", "enter")
        await wait_until(pilot, lambda: isinstance(app.screen, BlockScreen) and app.screen.rows)
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, OperatorScreen))
        await wait_until(
            pilot,
            lambda: "golden file vanished" in plain_text(app.screen.query_one("#detail", Static)),
        )
