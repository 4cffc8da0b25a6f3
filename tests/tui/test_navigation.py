"""Pilot tests: moving around the grid, jumps, follow mode, metric, filter, help, quit."""

from __future__ import annotations

from layerwatch.tui.grid import LayerGrid
from layerwatch.tui.screens.help import HelpScreen
from layerwatch.tui.screens.main import MainScreen
from layerwatch.tui.status import StatusBar
from layerwatch.tui.summary import CellSummary
from support.synthetic import KITCHEN_SINK, Scenario

from .conftest import make_app, plain_text, wait_until


def grid_of(app) -> LayerGrid:
    return app.screen.query_one(LayerGrid)


async def test_arrows_vi_keys_and_ends_move_the_cursor() -> None:
    app = make_app(Scenario(layers=16))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        grid = grid_of(app)
        assert (grid.cursor_row, grid.cursor_block) == (3, 3)  # finished: on the first failure
        await pilot.press("g")
        assert grid.cursor_row == 0 and not grid.following
        await pilot.press("home", "j", "down", "l", "right")
        assert (grid.cursor_row, grid.cursor_col) == (2, 2)
        await pilot.press("k", "h")
        assert (grid.cursor_row, grid.cursor_col) == (1, 1)
        await pilot.press("end")
        assert grid.cursor_col == len(app.model.visible) - 1 == 18
        assert grid.first_column > 0  # scrolled right by whole columns
        assert grid.scroll_offset.x % 6 == 0
        await pilot.press("home")
        assert grid.cursor_col == 0 and grid.first_column == 0
        await pilot.press("G")
        assert grid.cursor_row == 7
        await pilot.press("pageup")
        assert grid.cursor_row == 0


async def test_summary_follows_the_cursor_and_lists_failing_pairs() -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("f")
        summary = app.screen.query_one(CellSummary)
        assert summary.info is not None and (summary.info.token, summary.info.block.label) == (
            3,
            "L2",
        )
        await wait_until(pilot, lambda: summary.pairs is not None)
        text = plain_text(summary)
        assert "first failure" in text
        assert "self_attn.o_proj · cos 0.912" in text


async def test_first_next_and_previous_failure() -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        grid = grid_of(app)
        await pilot.press("f")
        assert (grid.cursor_row, grid.cursor_col) == (3, 3)
        await pilot.press("n")
        assert (grid.cursor_row, grid.cursor_col) == (3, 4)
        await pilot.press("N", "N")  # the first failure has nothing before it: stays
        assert (grid.cursor_row, grid.cursor_col) == (3, 3)
        await pilot.press("g", "home", "n")
        first_bad = app.model.next_failure(0, 0, 1)
        assert (grid.cursor_row, grid.cursor_col) == first_bad
        await pilot.press("G", "end", "n")  # nothing after the last cell: a notice, no move
        assert (grid.cursor_row, grid.cursor_col) == (7, 10)


async def test_first_failure_is_in_words_in_the_status_line() -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        status = plain_text(app.screen.query_one(StatusBar))
        assert "token 3 · layer 2 · self_attn.o_proj · cos 0.912" in status
        assert "golden ■ exited 0" in status


async def test_follow_mode_tracks_new_tokens_until_the_user_moves() -> None:
    app = make_app(KITCHEN_SINK, live=True)
    async with app.run_test(size=(80, 24)) as pilot:
        grid = grid_of(app)
        source = app.source
        source.advance(2)
        await wait_until(pilot, lambda: app.model.n_tokens == 2)
        assert grid.following and grid.cursor_row == 1
        source.advance(2)
        await wait_until(pilot, lambda: app.model.n_tokens == 4)
        assert grid.cursor_row == 3
        await pilot.press("k")
        assert not grid.following
        source.advance(2)
        await wait_until(pilot, lambda: app.model.n_tokens == 6)
        assert grid.cursor_row == 2
        assert "paused" in plain_text(app.screen.query_one(StatusBar))
        await pilot.press("space")
        assert grid.following and grid.cursor_row == 5


async def test_metric_cycles_and_recolours() -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        before = app.model.codes[:8, :11].copy()
        await pilot.press("m")
        assert app.model.metric == "relative_euclidean_distance"
        assert (app.model.codes[:8, :11] != before).any()
        await pilot.press("m", "m", "m")
        assert app.model.metric == "local_error"
        await pilot.press("m")
        assert app.model.metric == "cosine_similarity"
        assert (app.model.codes[:8, :11] == before).all()


async def test_filter_columns_by_name() -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("slash")
        await pilot.press(*"norm")
        assert [app.model.blocks[b].label for b in app.model.visible] == ["norm"]
        await pilot.press("enter")
        assert isinstance(app.focused, LayerGrid)
        await pilot.press("f")  # the first failure is hidden by the filter: the filter goes
        assert app.model.filter_text == ""
        assert grid_of(app).cursor_block == 3
        await pilot.press("slash", *"L1", "escape")
        assert app.model.filter_text == "" and len(app.model.visible) == 11


async def test_help_opens_and_closes() -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.press("escape")
        await wait_until(pilot, lambda: isinstance(app.screen, MainScreen))


async def test_mouse_click_moves_and_double_click_opens() -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        grid = grid_of(app)
        # header line, then token rows; labels are 6 wide, columns 6 wide
        await pilot.click(LayerGrid, offset=(6 + 6 * 2 + 1, 1 + 4))
        assert (grid.cursor_row, grid.cursor_col) == (4, 2)
        await pilot.double_click(LayerGrid, offset=(6 + 6 * 2 + 1, 1 + 4))
        await wait_until(pilot, lambda: type(app.screen).__name__ == "BlockScreen")


async def test_quit_exit_codes() -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("q")
    assert app.return_value == 1  # the kitchen sink has failures
    clean = make_app(Scenario(fault_token=None, diverge_from=None))
    async with clean.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert clean.state.first_failure is None
        await pilot.press("q")
    assert clean.return_value == 0


async def test_when_the_run_finishes_the_cursor_goes_to_the_first_failure() -> None:
    app = make_app(KITCHEN_SINK, live=True)
    async with app.run_test(size=(80, 24)) as pilot:
        grid = grid_of(app)
        app.source.advance(6)
        await wait_until(pilot, lambda: app.model.n_tokens == 6)
        assert grid.following and grid.cursor_row == 5
        app.source.advance(2)  # the last batch says done
        await wait_until(pilot, lambda: app.state.done)
        assert (grid.cursor_row, grid.cursor_block) == (3, 3) and not grid.following


async def test_a_user_who_moved_keeps_the_cursor_when_the_run_finishes() -> None:
    app = make_app(KITCHEN_SINK, live=True)
    async with app.run_test(size=(80, 24)) as pilot:
        grid = grid_of(app)
        app.source.advance(6)
        await wait_until(pilot, lambda: app.model.n_tokens == 6)
        await pilot.press("g", "l")
        app.source.advance(2)
        await wait_until(pilot, lambda: app.state.done)
        assert (grid.cursor_row, grid.cursor_col) == (0, 1)


async def test_command_palette_runs_registry_actions() -> None:
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        grid = grid_of(app)
        await pilot.press("g", "home")
        await pilot.press("ctrl+p")
        await pilot.press(*"first fail")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await wait_until(pilot, lambda: (grid.cursor_row, grid.cursor_block) == (3, 3))
        await pilot.press("ctrl+p")
        await pilot.press(*"next metric")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.model.metric == "relative_euclidean_distance")


async def test_a_source_that_cannot_start_ends_the_app_with_its_message() -> None:
    from layerwatch.capture.errors import LayerwatchError

    app = make_app()

    def refuse() -> None:
        raise LayerwatchError("golden command not found: nosuchbinary")

    app.source.start = refuse
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
    assert app.return_value == 2
    assert app.error == "golden command not found: nosuchbinary"


async def test_a_finished_run_with_nothing_compared_says_so() -> None:
    from layerwatch.engine.seam import ResultBatch, RunStatus

    app = make_app(KITCHEN_SINK, live=True)
    async with app.run_test(size=(80, 24)) as pilot:
        app.source.sink.on_batch(
            ResultBatch(
                runs={
                    "target": RunStatus(
                        "target", "crashed", exit_code=3, message="exited with code 3"
                    )
                },
                notes=["target: command exited with code 3 before writing anything"],
                done=True,
            )
        )
        await wait_until(pilot, lambda: app.state.done)
        status = plain_text(app.screen.query_one(StatusBar))
        assert "nothing to compare" in status and "exited with code 3 before" in status
        assert "target ✖ exited with code 3" in status
        await pilot.press("q")
    assert app.return_value == 1  # a crashed run is not a pass


async def test_the_mouse_wheel_stops_follow_mode() -> None:
    from textual import events

    app = make_app(KITCHEN_SINK, live=True)
    async with app.run_test(size=(80, 24)) as pilot:
        app.source.advance(4)
        await wait_until(pilot, lambda: app.model.n_tokens == 4)
        grid = grid_of(app)
        assert grid.following
        grid.post_message(events.MouseScrollUp(grid, 10, 5, 0, 0, 0, False, False, False))
        await wait_until(pilot, lambda: not grid.following)
        app.source.advance(2)
        await wait_until(pilot, lambda: app.model.n_tokens == 6)
        assert grid.cursor_row == 3
