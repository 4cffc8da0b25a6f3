"""Per-case dumps in the TUI (issue 13): the cases list first, Enter opens a case's grid,
Esc comes back."""

from __future__ import annotations

from pathlib import Path

import pytest
from layerwatch.engine.case_sources import CaseSet
from layerwatch.engine.session.core import CompareSession
from layerwatch.tui.app import LayerwatchApp
from layerwatch.tui.screens.cases import CasesScreen
from layerwatch.tui.screens.main import MainScreen
from textual.widgets import DataTable

from .conftest import save_shot, wait_until

torch = pytest.importorskip("torch")


def _demo_cases(out: Path, fault: str | None, keys: list[str]) -> None:
    from layerwatch.capture import DumpConfig, case, register_hook
    from layerwatch.capture.demo import build_model, generate, make_prompt

    model = build_model(fault=fault, layers=4)
    with register_hook(model, DumpConfig(dump_path=str(out))):
        for i, key in enumerate(keys):
            with case(key):
                generate(model, make_prompt(6, seed=10 + i), 6 if i == 1 else 3)


@pytest.fixture(scope="module")
def case_dumps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("cases")
    _demo_cases(root / "g", None, ["a", "b", "c"])
    _demo_cases(root / "t", "rotary_swap", ["a", "b", "c"])
    return root / "g", root / "t"


def _app(golden: Path, target: Path) -> LayerwatchApp:
    cases = CaseSet(str(golden), str(target), lambda: CompareSession(jobs=1))
    return LayerwatchApp(
        None, title="layerwatch open · g vs t", color_system="truecolor", cases=cases
    )


def _table_text(table: DataTable) -> list[list[str]]:
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


async def test_cases_list_then_a_case_grid_and_back(case_dumps, tmp_path: Path) -> None:
    app = _app(*case_dumps)
    async with app.run_test(size=(110, 24)) as pilot:
        await wait_until(pilot, lambda: isinstance(app.screen, CasesScreen) and app.screen.rows)
        screen = app.screen
        table = screen.query_one(DataTable)
        rows = _table_text(table)
        assert [r[0] for r in rows] == ["a", "b", "c"]
        assert [r[1] for r in rows] == ["✔ pass", "✖ FAIL", "✔ pass"]
        assert rows[1][2] == "4" and rows[1][4] == "root.layers.1.attention.rope"
        assert rows[1][3].split("/")[0] != "0" and rows[0][3].startswith("0/")
        assert table.cursor_row == 1  # the cursor starts on the first failing case
        await pilot.pause(0.1)
        save_shot(app, "cases.svg", tmp_path)
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, MainScreen) and app.state.done)
        assert app.title_text.endswith("case b")
        first = app.state.first_failure
        assert (first.token, first.node) == (4, "root.layers.1.attention.rope")
        await pilot.press("f", "enter")  # the drill-down works on the case's session
        await wait_until(pilot, lambda: getattr(app.screen, "rows", None))
        assert any(r.key.node == first.node for r in app.screen.rows)
        await pilot.press("escape", "escape")
        await wait_until(pilot, lambda: isinstance(app.screen, CasesScreen))
        assert app.screen is screen and app.main_screen is None
        await pilot.press("up", "enter")  # a passing case: a clean grid
        await wait_until(pilot, lambda: isinstance(app.screen, MainScreen) and app.state.done)
        assert app.title_text.endswith("case a") and app.state.first_failure is None
        assert app.state.summary.pairs > 0
        await pilot.press("escape", "n")
        await wait_until(pilot, lambda: isinstance(app.screen, CasesScreen))
        await pilot.press("q")
    assert app.return_value == 1  # a failing case: compare's exit code


async def test_case_grid_opened_twice_shows_the_same_cells(case_dumps) -> None:
    app = _app(*case_dumps)
    async with app.run_test(size=(100, 24)) as pilot:
        await wait_until(pilot, lambda: isinstance(app.screen, CasesScreen) and app.screen.rows)
        counts = []
        for _ in range(2):
            await pilot.press("enter")
            await wait_until(pilot, lambda: isinstance(app.screen, MainScreen) and app.state.done)
            counts.append((app.state.summary.pairs, app.state.summary.failed))
            await pilot.press("escape")
            await wait_until(pilot, lambda: isinstance(app.screen, CasesScreen))
        assert counts[0] == counts[1] and counts[0][1] > 0


def test_cases_screen_snapshot(case_dumps, snap_compare) -> None:
    """The cases list at 80×24 (seeded demo dumps: the same rows on every machine)."""
    app = _app(*case_dumps)

    async def loaded(pilot) -> None:
        await wait_until(pilot, lambda: isinstance(app.screen, CasesScreen) and app.screen.rows)
        await pilot.pause(0.1)

    assert snap_compare(app, terminal_size=(80, 24), run_before=loaded)
