"""A truncated file in a finished dump is named once by ``open``, ``watch`` and ``compare``.

msit's own fixture dump (READERS'), copied, with one ``.pth`` cut short: its counterpart is
reported unpaired *and* the user is told which file was skipped and why. ``watch`` has a
watcher that also finds the file incomplete; the note still appears once.
"""

from __future__ import annotations

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
