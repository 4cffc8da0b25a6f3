"""open_dump: detection from any directory form, one-line errors, and no torch import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.readers import DumpReader, detect, open_dump

from .conftest import FIXTURES

CASES = [
    ("msit/golden/msit_dump_fixture", "msit"),
    ("msit/golden/msit_dump_fixture/torch_tensors", "msit"),
    ("msit/golden/msit_dump_fixture/torch_tensors/cpu_1000", "msit"),
    ("msit/golden/msit_dump_fixture/torch_tensors/cpu_1000/2", "msit"),
    ("msit/stats/msit_dump_fixture", "msit"),
    ("msprobe/tensor_golden", "msprobe"),
    ("msprobe/tensor_golden/step0", "msprobe"),
    ("msprobe/tensor_golden/step0/proc1000", "msprobe"),
    ("msprobe/stats_target/step0/proc2000/dump.json", "msprobe"),
    ("atb/msit_dump_fixture", "atb"),
    ("atb/msit_dump_fixture/tensors", "atb"),
    ("atb/msit_dump_fixture/tensors/0_4242", "atb"),
    ("atb/msit_dump_fixture/tensors/0_4242/0", "atb"),
]


@pytest.mark.parametrize(("rel", "fmt"), CASES)
def test_detects_every_entry_point(rel: str, fmt: str) -> None:
    path = FIXTURES / rel
    assert detect(path) == fmt
    reader = open_dump(path, side="target")
    assert isinstance(reader, DumpReader)
    assert reader.fmt == fmt and reader.side == "target"  # type: ignore[attr-defined]
    assert reader.watch_roots() and reader.poll().tensors


def test_unrecognised_and_missing_paths(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hi")
    for path, pattern in (
        (tmp_path / "nope", "no such directory"),
        (tmp_path, "not a dump layerwatch can read"),
        (tmp_path / "notes.txt", "not a dump layerwatch can read"),
        (FIXTURES, "not a dump layerwatch can read"),
    ):
        with pytest.raises(LayerwatchError, match=pattern) as err:
            open_dump(path)
        assert "\n" not in str(err.value)
    with pytest.raises(LayerwatchError, match="is not an msit torch dump"):
        open_dump(tmp_path, fmt="msit")
    with pytest.raises(LayerwatchError, match="unknown dump format"):
        open_dump(tmp_path, fmt="onnx")


def test_reading_and_loading_never_imports_torch() -> None:
    code = f"""
import sys
from layerwatch.engine.readers import open_dump
from layerwatch.engine.readers.load import load_array
for rel in ("msit/golden/msit_dump_fixture", "msprobe/tensor_golden", "atb/msit_dump_fixture"):
    for record in open_dump({str(FIXTURES)!r} + "/" + rel).poll().tensors:
        load_array(record.loc)
assert "torch" not in sys.modules, "torch was imported"
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
