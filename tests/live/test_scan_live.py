"""``layerwatch dump --scan [--exit-on-anomaly]``: the scan while a real command dumps."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from .helpers import PROGRAMS, index_records, layerwatch

pytest.importorskip("transformers")
PROGRAM = PROGRAMS / "tiny_hf_steps.py"
STEPS = 40


def _tokens(out: Path) -> int:
    return len({r["token"] for r in index_records(out) if r["k"] == "token"})


def test_exit_on_anomaly_stops_the_command_at_the_first_one(tmp_path: Path) -> None:
    out = tmp_path / "dump"
    report = tmp_path / "scan.json"
    res = layerwatch(
        "dump", "--out", str(out), "--scan", "--exit-on-anomaly", "--scan-output", str(report),
        "--", sys.executable, str(PROGRAM), "nan", str(STEPS), timeout=180,
    )  # fmt: skip
    assert res.returncode == 1, res.stderr
    live = [ln for ln in res.stderr.splitlines() if "anomaly:" in ln]
    assert len(live) == 1 and "root.model.layers.1.mlp.act_fn · output: nan appears" in live[0]
    assert "Traceback" not in res.stderr  # we stopped it: its KeyboardInterrupt is not news
    assert _tokens(out) < STEPS // 2  # stopped within a few steps, not at the end
    obj = json.loads(report.read_text())
    assert obj["first_failure"]["node"] == "root.model.layers.1.mlp.act_fn"
    assert "first anomaly: token 0 · root.model.layers.1.mlp.act_fn" in res.stdout


def test_scan_of_a_benign_run_is_quiet_and_keeps_the_exit_code(tmp_path: Path) -> None:
    out = tmp_path / "dump"
    res = layerwatch(
        "dump", "--out", str(out), "--scan", "--", sys.executable, str(PROGRAM), "benign", "3",
        timeout=180,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "anomaly:" not in res.stderr and "no anomaly" in res.stdout
    assert _tokens(out) == 3
