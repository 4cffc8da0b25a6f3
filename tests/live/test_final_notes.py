"""A truncated file in a finished dump is named once by ``open``, ``watch`` and ``compare``.

msit's own fixture dump (READERS'), copied, with one ``.pth`` cut short: its counterpart is
reported unpaired *and* the user is told which file was skipped and why. ``watch`` has a
watcher that also finds the file incomplete; the note still appears once.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from live.helpers import layerwatch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "msit"
CUT = "torch_tensors/cpu_1000/1/root.model.layers.0.mlp.down_proj/output.pth"


@pytest.fixture
def dumps(tmp_path: Path) -> tuple[Path, Path, Path]:
    golden, target = tmp_path / "golden", tmp_path / "target"
    shutil.copytree(FIXTURES / "golden" / "msit_dump_fixture", golden / "msit_dump_1")
    shutil.copytree(FIXTURES / "target" / "msit_dump_fixture", target / "msit_dump_1")
    cut = golden / "msit_dump_1" / CUT
    os.truncate(cut, cut.stat().st_size // 2)
    return golden / "msit_dump_1", target / "msit_dump_1", cut


@pytest.mark.parametrize("command", ["open", "watch", "compare"])
def test_truncated_pth_is_named_once(command: str, dumps: tuple[Path, Path, Path]) -> None:
    golden, target, cut = dumps
    extra = {"open": ["--headless"], "watch": ["--headless", "--idle", "1"]}.get(command, [])
    proc = layerwatch(command, *extra, str(golden), str(target), timeout=90)
    assert proc.returncode == 1, proc.stderr  # the fixture's target has a real fault
    note = f"golden: {cut}: truncated or corrupt, skipped"
    assert proc.stdout.count(note) == 1, proc.stdout
    if command != "compare":  # live front ends say it as it happens, too
        assert proc.stderr.count(note) == 1, proc.stderr
    assert "incomplete file skipped" not in proc.stdout + proc.stderr  # not twice in other words
    assert "1 unpaired" in proc.stdout


@pytest.mark.parametrize("output", [["-o", "report.csv"], ["--json"], ["--json", "-o", "r.jsonl"]])
def test_compare_without_its_summary_names_the_truncated_file_on_stderr(
    output: list[str], dumps: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """``-o`` prints no summary and ``--json`` keeps stdout for the object: the note that a
    file was skipped goes to stderr, once, and the JSON on stdout still parses."""
    golden, target, cut = dumps
    argv = [a if a.startswith("-") else str(tmp_path / a) for a in output]
    proc = layerwatch("compare", str(golden), str(target), *argv, timeout=90)
    assert proc.returncode == 1, proc.stderr
    note = f"note: golden: {cut}: truncated or corrupt, skipped"
    assert proc.stderr.count(note) == 1, proc.stderr
    assert note not in proc.stdout
    if "--json" in output:  # a script reading the object learns it too
        obj = json.loads(proc.stdout)
        assert obj["summary"]["unpaired"] == 1
        assert f"golden: {cut}: truncated or corrupt, skipped" in obj["notes"]
        assert list(obj)[-1] == "rows"
    if output[-1].endswith(".jsonl"):
        tail = json.loads((tmp_path / output[-1]).read_text().splitlines()[-1])
        assert f"golden: {cut}: truncated or corrupt, skipped" in tail["notes"]


def test_a_whole_dump_has_no_notes_key(tmp_path: Path) -> None:
    """Notes are in the object only when a reader made some: clean dumps keep its shape."""
    proc = layerwatch(
        "compare",
        str(FIXTURES / "golden" / "msit_dump_fixture"),
        str(FIXTURES / "target" / "msit_dump_fixture"),
        "--json",
        timeout=90,
    )
    assert proc.returncode == 1, proc.stderr
    assert "notes" not in json.loads(proc.stdout) and proc.stderr == ""


def test_open_headless_json_says_the_note_as_it_happens_and_not_again(
    dumps: tuple[Path, Path, Path],
) -> None:
    golden, target, cut = dumps
    proc = layerwatch("open", "--headless", "--json", str(golden), str(target), timeout=90)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count(f"golden: {cut}: truncated or corrupt, skipped") == 1, proc.stderr
