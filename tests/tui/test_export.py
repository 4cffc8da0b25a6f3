"""Pilot tests: e writes the report through source.export, in a worker."""

from __future__ import annotations

import json
from pathlib import Path

from layerwatch.tui.screens.export import ExportScreen, export_words
from layerwatch.tui.screens.main import MainScreen
from textual.widgets import Input

from .conftest import make_app, wait_until


async def _export(tmp_path: Path, name: str) -> Path:
    app = make_app()
    target = tmp_path / name
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("e")
        await wait_until(pilot, lambda: isinstance(app.screen, ExportScreen))
        box = app.screen.query_one(Input)
        assert box.value == "layerwatch-report.csv"
        box.value = str(target)
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, MainScreen))
        await wait_until(pilot, lambda: target.exists())
        assert app.source.exports == [str(target)]
    return target


async def test_export_csv(tmp_path: Path) -> None:
    target = await _export(tmp_path, "report.csv")
    lines = target.read_text().splitlines()
    assert lines[0].startswith("token,node,tensor,verdict")
    assert len(lines) == 1 + 1704


async def test_export_json(tmp_path: Path) -> None:
    target = await _export(tmp_path, "report.json")
    data = json.loads(target.read_text())
    assert data["summary"]["fail"] > 0


async def test_export_error_is_reported_and_escape_cancels(tmp_path: Path) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("e")
        await wait_until(pilot, lambda: isinstance(app.screen, ExportScreen))
        app.screen.query_one(Input).value = str(tmp_path / "missing" / "dir" / "r.csv")
        await pilot.press("enter")
        await wait_until(
            pilot, lambda: any("Export failed" in str(n.message) for n in app._notifications)
        )
        await pilot.press("e")
        await wait_until(pilot, lambda: isinstance(app.screen, ExportScreen))
        await pilot.press("escape")
        await wait_until(pilot, lambda: isinstance(app.screen, MainScreen))
        assert app.source.exports == []


async def test_the_box_says_every_format_in_full() -> None:
    """The export box names the formats on lines that fit it (one long line was cut at its
    edge, mid-suffix), Parquet only where the report has that form (not a scan's)."""
    from rich.cells import cell_len
    from textual.widgets import Label

    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("e")
        await wait_until(pilot, lambda: isinstance(app.screen, ExportScreen))
        await pilot.pause(0.1)
        label = app.screen.query(Label).first()
        text = str(label.content)
        assert text.endswith(".json, .jsonl or .parquet") and ".csv" in text
        assert all(cell_len(line) <= label.content_region.width for line in text.splitlines())
    assert "parquet" not in export_words(parquet=False)
