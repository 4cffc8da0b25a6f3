"""The grid marks the step where the generated tokens part, greys what was not compared, and
``d`` jumps to that step's logits, whose detail shows both ids, the margin and the verdict."""

from __future__ import annotations

from layerwatch.engine.seam import CellState
from layerwatch.tui import keys, palette
from layerwatch.tui.grid import LayerGrid
from layerwatch.tui.screens.block import BlockScreen
from layerwatch.tui.screens.operator import OperatorScreen
from rich.color import Color
from support.synthetic import Scenario
from textual.widgets import Static

from .conftest import make_app, plain_text, wait_until


def test_parting_mark_has_its_own_glyph_colour_and_legend_entry() -> None:
    entries = {glyph: (meaning, code) for glyph, meaning, code in palette.legend_entries("cos")}
    assert entries["»"] == ("parts", palette.PARTING_CODE)  # outputs part here
    assert entries["≠"][0] == "not compared"
    assert palette.GLYPH_PARTING in palette.CELL_TEXTS[palette.PARTING_CODE]
    for scheme in (palette.RGB, palette.ANSI16):
        styles = palette.cell_styles(scheme)
        parting = styles[palette.PARTING_CODE].bgcolor
        others = {styles[code].bgcolor for _g, _m, code in palette.legend_entries("cos")}
        assert sum(bg == parting for bg in others) == 1  # no other entry shares its colour
        grey = styles[CellState.DIVERGED * palette.CODES_PER_STATE + 30].bgcolor
        assert grey is not None
        r, g, b = Color.parse(grey.name).get_truecolor()
        assert r == g == b  # not-compared cells are grey


def test_the_jump_is_in_the_one_registry() -> None:
    found = [a for a in keys.ACTIONS if a.name == "parting"]
    assert len(found) == 1 and found[0].scope == "main" and found[0].keys == "d"
    assert any(b.action == "parting" for b in keys.bindings("main"))


async def test_d_jumps_to_the_parting_logits_and_the_detail_says_why() -> None:
    app = make_app()  # diverge_from=6: step 5 chose 515 where the golden chose 501
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        grid = app.screen.query_one(LayerGrid)
        assert app.model.parting == 5
        label = grid._row(5, 0, 3, 60, -1).text
        assert label.split()[0] == "5»"
        assert grid._row(4, 0, 3, 60, -1).text.split()[0] == "4"
        await pilot.press("d")
        assert grid.cursor_row == 5
        assert app.model.blocks[grid.cursor_block].label == "lm_head"
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, BlockScreen) and app.screen.rows)
        await pilot.press("enter")
        await wait_until(
            pilot, lambda: isinstance(app.screen, OperatorScreen) and app.screen.detail
        )
        text = plain_text(app.screen.query_one("#detail", Static))
        assert "where the outputs part" in text
        assert "golden chose 501 · target chose 515" in text
        assert "golden margin (top-1 − top-2): 0.047" in text
        assert "a near tie for bfloat16" in text


async def test_no_parting_no_mark_and_d_says_so() -> None:
    app = make_app(Scenario(diverge_from=None))
    async with app.run_test(size=(120, 32)) as pilot:
        await pilot.pause()
        grid = app.screen.query_one(LayerGrid)
        before = (grid.cursor_row, grid.cursor_col)
        await pilot.press("d")
        assert app.model.parting is None and (grid.cursor_row, grid.cursor_col) == before
        assert all("»" not in grid._row(t, 0, 3, 60, -1).text for t in range(8))


async def test_live_mark_appears_with_the_first_diverged_token_and_stays() -> None:
    app = make_app(live=True)
    async with app.run_test(size=(120, 32)) as pilot:
        source = app.source
        source.advance(6)  # tokens 0..5: nothing diverged yet
        await wait_until(pilot, lambda: app.model.n_tokens == 6)
        assert app.model.parting is None and app.state.divergence is None
        source.advance(1)
        await wait_until(pilot, lambda: app.model.parting == 5)
        first = app.state.divergence
        source.advance(1)
        await wait_until(pilot, lambda: app.model.n_tokens == 8)
        assert app.model.parting == 5
        later = app.state.divergence
        assert (later.token, later.golden_id, later.target_id) == (5, 501, 515)
        assert later.not_compared_tokens == (6, 7) and first.not_compared_tokens == (6,)
