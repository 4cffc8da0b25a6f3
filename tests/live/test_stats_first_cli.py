"""``layerwatch dump --stats-first [--keep-tokens N]`` on a real command."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from .helpers import PROGRAMS, index_records, layerwatch

pytest.importorskip("transformers")
PROGRAM = PROGRAMS / "tiny_hf_steps.py"


def test_stats_first_keeps_the_last_tokens_payloads(tmp_path: Path) -> None:
    out = tmp_path / "dump"
    res = layerwatch(
        "dump", "--out", str(out), "--stats-first", "--keep-tokens", "2",
        "--", sys.executable, str(PROGRAM), "benign", "6", timeout=180,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    records = index_records(out)
    dropped = {r["file"] for r in records if r["k"] == "drop"}
    tensors = [r for r in records if r["k"] == "t"]
    kept = {r["token"] for r in tensors if r["file"] and r["file"] not in dropped}
    assert dropped and kept == {4, 5}  # the steps sleep 0.2 s: one token per data file
    assert {r["token"] for r in tensors} == set(range(6))
    manifest = json.loads(next(out.glob("*/manifest.json")).read_text())
    assert manifest["config"]["keep_tokens"] == 2


@pytest.mark.parametrize(
    "args, message",
    [
        (["--keep-tokens", "0"], "--keep-tokens must be 1 or more"),
        (["--stats-first", "--stats-only"], "--stats-first needs tensors"),
        (["--stats-first", "--format", "msit"], "--stats-first needs tensors"),
    ],
)
def test_bad_stats_first_options_are_one_line(args: list[str], message: str, tmp_path) -> None:
    res = layerwatch("dump", "--out", str(tmp_path), *args, "--", "true")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and message in lines[0]
