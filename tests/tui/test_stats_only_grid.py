"""The compare grid on statistics-only pairs (statistics-first dumps, issue 15 item 3): the cells
still carry the verdict and the status line says those tokens were judged on statistics."""

from __future__ import annotations

from pathlib import Path

import pytest
from layerwatch.engine.live.pipeline import LivePipeline, attach_spec
from layerwatch.engine.seam import CellState
from layerwatch.engine.session.core import CompareSession
from layerwatch.engine.wording import stats_only_words
from layerwatch.tui.app import LayerwatchApp
from layerwatch.tui.status import StatusBar

from .conftest import plain_text, save_shot, wait_until

torch = pytest.importorskip("torch")


def _stats_first(out: Path, fault: str | None) -> None:
    from layerwatch.capture import DumpConfig, register_hook
    from layerwatch.capture.demo import build_model, generate, make_prompt

    model = build_model(fault=fault, layers=4)
    config = DumpConfig(dump_path=str(out), keep_tokens=2, batch_bytes=32 * 1024)
    with register_hook(model, config):
        generate(model, make_prompt(6, seed=3), 8)


async def test_grid_on_statistics_only_pairs_says_so(tmp_path: Path) -> None:
    _stats_first(tmp_path / "g", None)
    _stats_first(tmp_path / "t", "rotary_swap")
    source = LivePipeline(
        attach_spec(str(tmp_path / "g"), idle_s=0, watch=False),
        attach_spec(str(tmp_path / "t"), idle_s=0, watch=False),
        session=CompareSession(jobs=1),
    )
    app = LayerwatchApp(source, title="stats-first", color_system="truecolor")
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_until(pilot, lambda: app.state.done)
        tokens = sorted(app.state.stats_only_tokens)
        assert tokens and app.state.first_failure.token in tokens  # found from statistics
        assert 0 not in tokens  # the tokens whose payloads stayed are compared in full
        status = plain_text(app.screen.query_one(StatusBar), 120)
        assert "statistics only" in status and "msit -st" in status
        model = app.model
        first = app.state.first_failure
        assert model.state[first.token, first.block] == CellState.FAIL
        await pilot.pause(0.1)
        save_shot(app, "grid-stats-only.svg", tmp_path)


def test_stats_only_words_name_the_token_spans() -> None:
    assert stats_only_words([2, 3, 4, 5]).startswith("tokens 2–5: judged on max/min/mean/L2")
    assert stats_only_words([7]).startswith("token 7:")
    assert stats_only_words([1, 3, 4, 9]).startswith("tokens 1, 3–4, 9:")
