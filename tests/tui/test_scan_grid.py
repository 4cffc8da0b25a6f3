"""The anomaly scan as a live grid (issue 15 item 1): ``run``/``watch`` without a golden and
``dump --scan`` in a terminal show scan verdicts as tensors land."""

from __future__ import annotations

import json
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from layerwatch.capture.launch import CaptureOptions, LaunchSpec
from layerwatch.engine.live.pipeline import attach_spec
from layerwatch.engine.live.side import SideSpec
from layerwatch.engine.records import Verdict
from layerwatch.engine.scan import scan_dump
from layerwatch.engine.seam import CellState
from layerwatch.tui import keys
from layerwatch.tui.app import LayerwatchApp
from layerwatch.tui.frontends import scan_pipeline
from layerwatch.tui.screens.block import BlockScreen
from layerwatch.tui.screens.operator import OperatorScreen
from layerwatch.tui.status import Legend, StatusBar
from textual.widgets import Static

from .conftest import make_app, plain_text, save_shot, wait_until

pytest.importorskip("torch")

DEMO = [
    sys.executable,
    "-m",
    "layerwatch.capture.demo",
    "--dtype",
    "fp16",
    "--fault",
    "softmax_fp16",
]


def _args(**extra: object) -> object:
    import argparse

    return argparse.Namespace(
        poll=False, poll_interval=0.25, jump_ratio=None, jump_floor=None, **extra
    )


@pytest.fixture(scope="module")
def fp16_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo in fp16 with softmax's fault: from token 3 layers.4's softmax exponentiates in
    fp16, rows turn NaN there; the causal mask's −inf in every layer's scores is no anomaly."""
    out = tmp_path_factory.mktemp("scan") / "dump"
    subprocess.run([*DEMO, "--new-tokens", "6", "--dump", str(out)], check=True, timeout=180)
    return out


async def test_scan_grid_of_a_finished_dump_matches_layerwatch_scan(
    fp16_dump: Path, tmp_path: Path
) -> None:
    report = scan_dump(str(fp16_dump))
    first = report.first_failure
    pipeline = scan_pipeline(attach_spec(str(fp16_dump), idle_s=0, watch=False), _args())
    app = LayerwatchApp(pipeline, title="layerwatch watch · scan", color_system="truecolor")
    async with app.run_test(size=(120, 32)) as pilot:
        await wait_until(pilot, lambda: app.state.done)
        found = app.state.first_failure
        assert (found.token, found.node, found.stem) == (
            first.key.token,
            first.key.node,
            first.key.stem,
        )
        assert (found.token, found.node) == (3, "root.layers.4.attention.softmax")
        model = app.model
        assert model.verdict_only
        assert model.state[found.token, found.block] == CellState.NONFINITE  # NaN appears
        states = set(model.state[: model.n_tokens, : model.n_blocks].ravel().tolist())
        assert CellState.PASS in states and CellState.DIVERGED in states  # clean, carried in
        s = app.state.summary
        assert s.failed == sum(1 for r in report.rows if r.status != "propagated")
        assert s.diverged == sum(1 for r in report.rows if r.status == "propagated")
        assert "scan (no golden)" in plain_text(app.screen.query_one(Legend), 120)
        await pilot.press("f")
        await pilot.pause(0.2)
        save_shot(app, "grid-scan.svg", tmp_path)
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, BlockScreen) and app.screen.rows)
        rows = app.screen.rows
        bad = next(i for i, r in enumerate(rows) if r.verdict is Verdict.FAIL)
        assert rows[bad].key.node == first.key.node
        app.screen.query_one("DataTable").move_cursor(row=bad)
        await pilot.press("enter")
        await wait_until(
            pilot, lambda: isinstance(app.screen, OperatorScreen) and app.screen.detail
        )
        text = plain_text(app.screen.query_one("#detail", Static))
        assert "scan: nan appears here" in text and "NaN count" in text, text
        inputs = text.split("inputs of this operator", 1)[1].split("files", 1)[0]
        assert "input_0" in inputs and "✔ pass" in inputs and "✖" not in inputs  # clean inputs


def _footer_actions(app: LayerwatchApp) -> set[str]:
    """The actions the Footer and the keys reach on the current screen (Textual's own list)."""
    return {b.binding.action for b in app.screen.active_bindings.values()}


async def test_scan_grid_offers_no_compare_only_keys(fp16_dump: Path) -> None:
    """No golden: no parting step (d), no metric (m), no ranks (r). Their keys are neither in
    the Footer, the palette nor the help, and pressing them does nothing (no "not parted" or
    rank error notice); the compare grid keeps all three."""
    pipeline = scan_pipeline(attach_spec(str(fp16_dump), idle_s=0, watch=False), _args())
    app = LayerwatchApp(pipeline, title="layerwatch watch · scan", color_system="truecolor")
    compare_only = {"parting", "cycle_metric", "cycle_rank"}
    assert compare_only == keys.COMPARE_ONLY
    async with app.run_test(size=(160, 45)) as pilot:
        await wait_until(pilot, lambda: app.state.done)
        await pilot.pause(0.1)
        shown = _footer_actions(app)
        assert {"first_failure", "next_failure", "filter", "export", "open"} <= shown
        assert not shown & compare_only
        before = (len(app._notifications), app.model.metric_index, app.rank)
        for key in ("d", "m", "r"):
            await pilot.press(key)
        await pilot.pause(0.3)
        assert (len(app._notifications), app.model.metric_index, app.rank) == before
        palette = {c.title for c in app.get_system_commands(app.screen)}
        assert not {a.help for a in keys.ACTIONS if a.compare_only} & palette
        assert "Jump to the first failure" in palette
        await pilot.press("question_mark")
        await pilot.pause(0.2)
        text = plain_text(app.screen.query_one("#help-text", Static))
        assert "No golden run" in text and "an anomaly appears here" in text
        assert "metric" not in text.split("colours", 1)[0] and "parts" not in text
    with_golden = make_app()
    async with with_golden.run_test(size=(160, 45)) as pilot:
        await pilot.pause(0.2)
        assert compare_only - {"cycle_rank"} <= _footer_actions(with_golden)  # r: not in Footer
        await pilot.press("m")
        assert with_golden.model.metric_index == 1


async def test_scan_grid_fills_while_the_command_runs(tmp_path: Path) -> None:
    """A launched command: cells arrive in several ticks before it exits (live, not at the end)."""
    out = tmp_path / "live"
    # 200 tokens (the demo's positions allow ~250) of 12 layers (~6 s here, 4× the default
    # depth's time): long enough that a fast writer, which no longer wakes at every token,
    # still lands cells in several ticks while the child runs.
    argv = [*DEMO, "--new-tokens", "200", "--layers", "12"]
    launch = LaunchSpec(argv, out, CaptureOptions(), "layerwatch")
    pipeline = scan_pipeline(SideSpec(out, launch), _args())
    app = LayerwatchApp(pipeline, title="layerwatch run · scan", color_system="truecolor")
    child = pipeline.sides["target"].child
    landed: list[int] = []  # tokens of each batch with cells that came while the child ran
    on_batch = pipeline.sink.on_batch

    def spy(batch: object) -> None:
        if batch.cells and child.poll() is None:
            landed.append(max(c.token for c in batch.cells))
        on_batch(batch)

    pipeline.sink.on_batch = spy  # type: ignore[method-assign]
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.state.done, timeout=120)
    assert app.state.first_failure is not None
    assert len(landed) >= 2 and landed[0] < 199, landed  # cells came while it still ran
    assert app.model.n_tokens == 200  # the prefill and 199 more steps


def _layerwatch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "layerwatch.tui", *args], capture_output=True, text=True, timeout=180
    )


def test_headless_watch_of_one_dir_ends_like_scan(fp16_dump: Path) -> None:
    scan = _layerwatch("scan", str(fp16_dump), "--json")
    watch = _layerwatch("watch", str(fp16_dump), "--idle", "0", "--headless", "--json")
    assert scan.returncode == watch.returncode == 1, watch.stderr
    a, b = json.loads(scan.stdout), json.loads(watch.stdout)
    assert a["first_failure"] == b["first_failure"]
    assert [r["node"] for r in a["rows"]] == [r["node"] for r in b["rows"]]


def test_watch_of_a_mistyped_path_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """Neither the directory nor its folder exists: a typo, not a run yet to start."""
    typo = tmp_path / "no-such-folder" / "dump"
    for args in (
        ("watch", str(typo), "--headless"),
        ("watch", str(typo)),  # the TUI path stops before the TUI starts
        ("watch", str(tmp_path), str(typo), "--headless"),
        ("run", "--target", str(typo), "--headless"),
    ):
        done = _layerwatch(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.strip().splitlines() == [
            f"layerwatch {args[0]}: {typo}: no such directory, nor its folder {typo.parent} "
            "(a typo?)"
        ]


def _stderr_until(proc: subprocess.Popen[str], text: str, timeout: float = 60) -> str:
    """Read the child's stderr lines until one holds ``text`` (fails after ``timeout``)."""
    seen, deadline = "", time.monotonic() + timeout
    while text not in seen:
        assert time.monotonic() < deadline and proc.poll() is None, seen
        if select.select([proc.stderr], [], [], 0.5)[0]:
            seen += proc.stderr.readline()
    return seen


def test_headless_watch_waits_for_a_directory_yet_to_appear(
    fp16_dump: Path, tmp_path: Path
) -> None:
    """Its folder exists: a clear waiting line, then the dump is scanned once it appears."""
    later = tmp_path / "later"
    argv = ["watch", str(later), "--idle", "1", "--headless", "--json"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "layerwatch.tui", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        seen = _stderr_until(proc, "\n")
        assert seen == f"layerwatch: target: waiting for {later} to appear\n"
        shutil.copytree(fp16_dump, tmp_path / "staging")
        (tmp_path / "staging").rename(later)  # the whole dump appears at once
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 1, err
    scan = json.loads(_layerwatch("scan", str(fp16_dump), "--json").stdout)
    assert json.loads(out)["first_failure"] == scan["first_failure"]


async def test_scan_grid_says_it_waits_for_the_directory_to_appear(
    fp16_dump: Path, tmp_path: Path
) -> None:
    later = tmp_path / "later"
    pipeline = scan_pipeline(attach_spec(str(later), idle_s=0.5), _args())
    app = LayerwatchApp(pipeline, title="layerwatch watch · scan", color_system="truecolor")
    async with app.run_test(size=(160, 45)) as pilot:
        status = app.screen.query_one(StatusBar)
        await wait_until(pilot, lambda: "to appear" in plain_text(status))
        text = plain_text(status)
        assert f"waiting for {later} to appear" in text
        assert "waiting for tensors from the run" in text  # one run: no "both sides"
        shutil.copytree(fp16_dump, tmp_path / "staging")
        (tmp_path / "staging").rename(later)
        await wait_until(pilot, lambda: app.state.done, timeout=60)
        assert app.state.first_failure is not None
        assert "to appear" not in plain_text(status)
