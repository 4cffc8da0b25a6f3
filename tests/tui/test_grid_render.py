"""The grid's cheap cold repaint draws exactly what the plain way drew.

A cold repaint (a resize, a jump, a new metric) builds every visible line anew; the grid
cuts each line to the screen itself, reads the screen's cells in one numpy call and leaves
the ANSI→truecolor filter out because its styles went through it once (tui/grid.py). Each
shortcut is checked here against the way it replaces.
"""

from __future__ import annotations

import gc

import pytest
from layerwatch.tui.app import LayerwatchApp
from layerwatch.tui.grid import COLUMN, LayerGrid
from support.synthetic import KITCHEN_SINK, Scenario, SyntheticSource
from textual.filter import ANSIToTruecolor
from textual.strip import Strip


def _app(scenario: Scenario, color_system: str) -> LayerwatchApp:
    return LayerwatchApp(SyntheticSource(scenario), title="grid", color_system=color_system)


def _segments(strip: Strip) -> list[tuple[str, object]]:
    return [(s.text, s.style) for s in strip]


@pytest.mark.parametrize("color_system", ["truecolor", "standard"])
async def test_lines_look_the_same_without_the_truecolor_filter(color_system: str) -> None:
    """The filter the grid leaves out would change no segment of any line it draws: the
    header, labels, every cell state, the first failure, the cursor focused and not."""
    app = _app(KITCHEN_SINK, color_system)
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.press("f")  # the cursor on the first failure: both special cells drawn
        await pilot.pause()
        grid = app.screen.query_one(LayerGrid)
        truecolor = [f for f in app.get_line_filters() if isinstance(f, ANSIToTruecolor)]
        background = grid.background_colors[1]
        for focused in (True, False):
            if not focused:
                await pilot.press("slash")  # the filter box takes the focus
                await pilot.pause()
                assert not grid.has_focus
            grid._cache.clear()
            for y in range(grid.size.height):
                strip = grid.render_line(y)
                for f in truecolor:
                    assert _segments(strip.apply_filter(f, background)) == _segments(strip)
        left = grid.get_line_filters()
        assert not any(f in left for f in truecolor)
        assert [f for f in app.get_line_filters() if f not in truecolor] == list(left)


async def test_a_line_cut_at_any_width_is_the_wide_line_cropped() -> None:
    """Every width, the last column whole, cut inside its text or at its gap, or padded."""
    app = _app(Scenario(layers=12, tokens=10), "truecolor")
    async with app.run_test(size=(160, 30)) as pilot:
        await pilot.press("f")
        await pilot.pause()
        grid = app.screen.query_one(LayerGrid)
        columns = len(app.model.visible)
        wide = grid._label_width + columns * COLUMN + 7
        bad_row = app.model.first_bad[0]
        for row in sorted({0, bad_row, grid.cursor_row}):
            cursor = grid.cursor_col if row == grid.cursor_row else -1
            full = grid._row(row, 0, columns, wide, cursor)
            for width in range(grid._label_width + 1, wide + 1):
                cut = grid._row(row, 0, columns, width, cursor)
                assert cut.cell_length == width
                assert _segments(cut) == _segments(full.crop(0, width)), (row, width)
        header = grid._header(0, columns, wide)
        for width in range(grid._label_width + 1, wide + 1):
            assert _segments(grid._header(0, columns, width)) == _segments(header.crop(0, width))


@pytest.mark.parametrize("scroll", [(0, 0), (3, 2), (25, 5)])
async def test_a_frame_reads_the_screen_cells_in_one_call_and_draws_the_same(
    scroll: tuple[int, int],
) -> None:
    """Lines drawn inside a frame (the whole screen's codes fetched at once) equal lines
    drawn one by one, scrolled down and right."""
    app = _app(Scenario(layers=24, tokens=40), "truecolor")
    async with app.run_test(size=(90, 16)) as pilot:
        await pilot.pause()
        grid = app.screen.query_one(LayerGrid)
        grid.set_following(False)
        grid.move_cursor(scroll[0] + 5, scroll[1] + 3)
        grid.scroll_to(scroll[1] * COLUMN, scroll[0], animate=False, immediate=True, force=True)
        await pilot.pause()
        assert int(grid.scroll_offset.y) == scroll[0]
        height = grid.size.height
        grid._cache.clear()
        grid._frame = grid._read_frame()  # what render_lines does around a frame's lines
        framed = [grid.render_line(y) for y in range(height)]
        assert grid._window is not None and len(grid._window) == grid.data_height
        grid._frame = grid._window = None
        grid._cache.clear()
        single = [grid.render_line(y) for y in range(height)]
        assert [_segments(s) for s in framed] == [_segments(s) for s in single]
        assert single[1].text.split()[0].rstrip("!»") == str(scroll[0])


async def test_lines_a_cold_repaint_drops_are_freed_without_the_cyclic_collector() -> None:
    """Emptying the strip cache (a resize, a jump, another metric) and evicting from it
    leave no strip for the garbage collector: Textual's ``LRUCache`` ring kept every
    dropped strip alive until a collection, which made full collections the repaint's tail
    (tui/grid.py ``StripCache``)."""
    app = _app(Scenario(layers=24, tokens=40), "truecolor")
    async with app.run_test(size=(90, 16)) as pilot:
        await pilot.pause()
        grid = app.screen.query_one(LayerGrid)
        grid._cache.maxsize = 3  # evictions too, not only clear()
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(3):
                grid._cache.clear()
                for y in range(grid.size.height):
                    grid.render_line(y)
            assert len(grid._cache) == 3
            gc.collect()
            left = [o for o in gc.garbage if isinstance(o, Strip)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        assert left == []
