"""The rank selector (``r``) over a real tensor-parallel-shaped comparison: a single-card golden
and two rank directories (``RANK``/``WORLD_SIZE`` as torchrun sets them), rank 1's head
scaled by 1.1. The grid is the worst over ranks by default; ``r`` shows rank 0 (clean), rank 1
(failing), then the worst again; the block view lists both ranks with a rank column."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from layerwatch.capture import DumpConfig, register_hook
from layerwatch.engine.live.pipeline import LivePipeline, attach_spec
from layerwatch.engine.seam import CellState
from layerwatch.tui.app import LayerwatchApp
from layerwatch.tui.screens.block import BlockScreen
from support.tp_model import PROMPT, TPModel
from textual.widgets import DataTable

from .conftest import wait_until


def _capture(out: Path, scale: float = 1.0) -> None:
    model = TPModel().eval()
    with torch.no_grad():
        model.head.weight.mul_(scale)
        with register_hook(model, DumpConfig(dump_path=out)):
            model(torch.tensor([PROMPT]))


@pytest.fixture
def dumps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    _capture(tmp_path / "golden")
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank, scale in ((0, 1.0), (1, 1.1)):
        monkeypatch.setenv("RANK", str(rank))
        _capture(tmp_path / "tp", scale)
    return tmp_path / "golden", tmp_path / "tp"


def _failing(app: LayerwatchApp) -> int:
    model = app.model
    return int((model.state[: model.n_tokens] >= CellState.FAIL).sum())


async def test_r_cycles_through_the_ranks(dumps: tuple[Path, Path]) -> None:
    golden, target = dumps
    assert sorted(p.name for p in target.iterdir()) == ["rank0", "rank1"]
    pipeline = LivePipeline(
        attach_spec(golden, idle_s=0, watch=False), attach_spec(target, idle_s=0, watch=False)
    )
    app = LayerwatchApp(pipeline, title="tp", color_system="truecolor")
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_until(pilot, lambda: app.state.done)
        await pilot.pause(0.1)
        worst = _failing(app)
        assert worst > 0 and app.rank is None
        await pilot.press("r")
        await wait_until(pilot, lambda: app.rank == 0)
        assert _failing(app) == 0
        await pilot.press("r")
        await wait_until(pilot, lambda: app.rank == 1)
        assert _failing(app) == worst
        assert "rank 1 of 2" in app.main_screen.query_one("#status").render().plain
        await pilot.press("r")
        await wait_until(pilot, lambda: app.rank is None and app.ranks == (0, 1))
        assert _failing(app) == worst
        await pilot.press("f", "enter")
        await wait_until(pilot, lambda: isinstance(app.screen, BlockScreen) and app.screen.rows)
        screen = app.screen
        assert screen.ranked and {p.key.rank for p in screen.rows} == {0, 1}
        table = screen.query_one(DataTable)
        assert "rank" in [str(c.label) for c in table.columns.values()]
    pipeline.stop()
