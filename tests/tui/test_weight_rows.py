"""The operator view of a failing op whose weights differ shows the weight rows (issue 12)."""

from __future__ import annotations

from pathlib import Path

import pytest
from layerwatch.engine.live.pipeline import LivePipeline, attach_spec
from layerwatch.engine.session.core import CompareSession
from layerwatch.tui.app import LayerwatchApp
from layerwatch.tui.screens.operator import OperatorScreen
from textual.widgets import Static

from .conftest import plain_text, save_shot, wait_until

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

FAULT_NODE = "root.model.layers.1.mlp.down_proj"


def _dumps(tmp_path: Path) -> tuple[Path, Path]:
    from layerwatch.capture import DumpConfig, register_hook

    from tests.fixtures.tiny_llama import build

    for side, fault in (("g", False), ("t", True)):
        model = build(fault=fault)
        with register_hook(model, DumpConfig(dump_path=str(tmp_path / side))), torch.no_grad():
            model(torch.tensor([[11, 42, 7]]))
    return tmp_path / "g", tmp_path / "t"


async def test_operator_view_lists_the_weights_that_differ(tmp_path: Path) -> None:
    golden, target = _dumps(tmp_path)
    source = LivePipeline(
        attach_spec(str(golden), idle_s=0, watch=False),
        attach_spec(str(target), idle_s=0, watch=False),
        session=CompareSession(),
    )
    app = LayerwatchApp(source, title="weights", color_system="truecolor")
    async with app.run_test(size=(100, 40)) as pilot:
        await wait_until(pilot, lambda: app.state.done and app.state.root_cause is not None)
        cause = app.state.root_cause
        assert cause.node == FAULT_NODE
        result = next(
            r
            for r in source.session.results()
            if r.key.node == FAULT_NODE and r.key.stem.startswith("output") and not r
        )
        app.push_screen(OperatorScreen(result, None))
        await wait_until(
            pilot, lambda: isinstance(app.screen, OperatorScreen) and app.screen.detail
        )
        text = plain_text(app.screen.query_one("#detail", Static))
        assert "weights differ from the golden's" in text
        assert "weights differ: weight (norm " in text  # the why-sentence says it first
        row = next(line for line in text.splitlines() if line.lstrip().startswith("weight "))
        assert "✖ differ" in row and "[32, 64]" in row
        save_shot(app, "operator-weights-differ.svg", tmp_path)
        # a passing op with the same weights shows no weights section
        same = next(
            r
            for r in source.session.results()
            if r.key.node == "root.model.layers.0.mlp.down_proj" and r
        )
        await pilot.press("escape")
        app.push_screen(OperatorScreen(same, None))
        await wait_until(
            pilot,
            lambda: (
                isinstance(app.screen, OperatorScreen)
                and app.screen.detail
                and app.screen.result is same
            ),
        )
        text = plain_text(app.screen.query_one("#detail", Static))
        assert "weights differ" not in text
