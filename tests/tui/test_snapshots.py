"""SVG snapshots at 80×24 and 160×48 on seeded data (``pytest --snapshot-update`` to accept).

No clocks in the UI, the Input cursor does not blink (conftest), and the palette is fixed to
truecolor (or 16 colours, for the one test of that) whatever ``$TERM`` says.
"""

from __future__ import annotations

import pytest
from layerwatch.tui.app import LayerwatchApp
from layerwatch.tui.screens.block import BlockScreen
from layerwatch.tui.screens.help import HelpScreen
from layerwatch.tui.screens.operator import OperatorScreen
from support.synthetic import KITCHEN_SINK, SyntheticSource
from textual.pilot import Pilot

from .conftest import make_app, wait_until

SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((160, 48), id="160x48")]


async def _first_failure(pilot: Pilot) -> None:
    await pilot.press("f")
    await wait_until(pilot, lambda: pilot.app.screen.query_one("#summary").pairs is not None)


async def _block(pilot: Pilot) -> None:
    await pilot.press("f", "enter")
    await wait_until(
        pilot, lambda: isinstance(pilot.app.screen, BlockScreen) and pilot.app.screen.rows
    )


async def _operator(pilot: Pilot) -> None:
    await _block(pilot)
    await pilot.press("enter")
    await wait_until(
        pilot, lambda: isinstance(pilot.app.screen, OperatorScreen) and pilot.app.screen.detail
    )


async def _help(pilot: Pilot) -> None:
    await pilot.press("question_mark")
    await wait_until(pilot, lambda: isinstance(pilot.app.screen, HelpScreen))


@pytest.mark.parametrize("size", SIZES)
class TestScreens:
    def test_main_grid(self, snap_compare, size) -> None:
        """Every cell state; the first failure (token 3, L2) has "!" and the cursor on it."""
        assert snap_compare(make_app(), terminal_size=size, run_before=_first_failure)

    def test_block_view(self, snap_compare, size) -> None:
        """The operators of L2 at token 3; o_proj marked ◆ (inputs pass, output fails)."""
        assert snap_compare(make_app(), terminal_size=size, run_before=_block)

    def test_operator_view(self, snap_compare, size) -> None:
        """o_proj: golden vs target, thresholds, inputs, histogram, worst elements, files."""
        assert snap_compare(make_app(), terminal_size=size, run_before=_operator)

    def test_help(self, snap_compare, size) -> None:
        """Keys from the action registry and the colour legend."""
        assert snap_compare(make_app(), terminal_size=size, run_before=_help)


def test_main_grid_16_colours(snap_compare) -> None:
    """The 16-colour palette and the ANSI theme (what TEXTUAL_COLOR_SYSTEM=standard gets)."""
    app = LayerwatchApp(
        SyntheticSource(KITCHEN_SINK), title="layerwatch · 16 colours", color_system="standard"
    )
    assert snap_compare(app, terminal_size=(80, 24), run_before=_first_failure)


def test_filtered_and_scrolled(snap_compare) -> None:
    """A column filter in use, and a grid wider than the terminal scrolled by whole columns."""
    from support.synthetic import Scenario

    app = LayerwatchApp(
        SyntheticSource(Scenario(layers=24, tokens=40)),
        title="layerwatch · wide",
        color_system="truecolor",
    )

    async def run(pilot: Pilot) -> None:
        await pilot.press("g", "end", "k", "j")
        await pilot.press("slash", *"L2", "enter")

    assert snap_compare(app, terminal_size=(80, 24), run_before=run)
