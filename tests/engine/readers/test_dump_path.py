"""The directory the user gave the dumper is accepted as the dump.

msit writes ``{dump_path}/msit_dump_{timestamp}/`` (torch and ATB dumps alike), our capture
``{dump_path}/{device}_{pid}/`` and msprobe ``{dump_path}/step*/``: each ``dump_path`` opens.
One msit run inside → that run; several → a one-line refusal listing them, newest first.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.readers import detect, msit_runs, open_dump, resolve

from .conftest import FIXTURES, HandDump

MSIT_RUN = FIXTURES / "msit" / "golden" / "msit_dump_fixture"


@pytest.mark.parametrize(
    ("dump_path", "fmt", "run"),
    [
        ("msit/golden", "msit", "msit/golden/msit_dump_fixture"),
        ("msit/stats", "msit", "msit/stats/msit_dump_fixture"),
        ("atb", "atb", "atb/msit_dump_fixture"),
        ("msprobe/tensor_golden", "msprobe", "msprobe/tensor_golden"),
    ],
)
def test_the_dumpers_output_directory_opens(dump_path: str, fmt: str, run: str) -> None:
    reader = open_dump(FIXTURES / dump_path)
    assert detect(FIXTURES / dump_path) == fmt and reader.fmt == fmt
    assert reader.root == FIXTURES / run  # messages and watch roots name the real dump
    got = sorted(str(r.key) for r in reader.poll().tensors)
    assert got and got == sorted(str(r.key) for r in open_dump(FIXTURES / run).poll().tensors)


def test_our_dump_path_holding_rank_dirs_opens(tmp_path: Path) -> None:
    dump = HandDump(tmp_path)
    with open(dump.dir / "index.jsonl", "a") as fh:
        fh.write(dump.batch([(0, "root.a", "output", np.ones(4, np.float32))]))
    reader = open_dump(tmp_path)
    assert reader.fmt == "layerwatch" and len(reader.poll().tensors) == 1


def _runs(tmp_path: Path, n: int) -> list[Path]:
    runs = [tmp_path / f"msit_dump_2025010{i}_120000" for i in range(1, n + 1)]
    for run in runs:
        shutil.copytree(MSIT_RUN, run)
    (tmp_path / "msit_dump_20250109_000000").mkdir()  # started, nothing dumped: not a run
    return runs


def test_several_msit_runs_are_refused_with_their_names(tmp_path: Path) -> None:
    runs = _runs(tmp_path, 2)
    assert msit_runs(tmp_path) == runs
    assert detect(tmp_path) is None
    with pytest.raises(LayerwatchError) as err:
        open_dump(tmp_path)
    message = str(err.value)
    assert "\n" not in message
    assert f"holds 2 msit dumps (newest first: {runs[1].name}, {runs[0].name})" in message
    assert resolve(runs[0]) == runs[0]  # naming one of them works


def test_many_runs_are_listed_in_one_short_line(tmp_path: Path) -> None:
    runs = _runs(tmp_path, 5)
    with pytest.raises(LayerwatchError, match=r"holds 5 msit dumps") as err:
        resolve(tmp_path)
    assert runs[0].name not in str(err.value) and "(5 in all)" in str(err.value)


def test_an_empty_run_directory_is_still_not_a_dump(tmp_path: Path) -> None:
    (tmp_path / "msit_dump_20250101_120000").mkdir()
    with pytest.raises(LayerwatchError, match="not a dump layerwatch can read"):
        open_dump(tmp_path)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "layerwatch.tui", *args], capture_output=True, text=True, timeout=90
    )


def test_compare_and_open_take_msit_output_directories(tmp_path: Path) -> None:
    golden, target = FIXTURES / "msit" / "golden", FIXTURES / "msit" / "target"
    by_run = _cli("compare", str(golden / "msit_dump_fixture"), str(target / "msit_dump_fixture"))
    by_dir = _cli("compare", str(golden), str(target))
    opened = _cli("open", "--headless", str(golden), str(target))
    assert by_run.returncode == by_dir.returncode == opened.returncode == 1  # a real fault
    assert by_dir.stdout == by_run.stdout == opened.stdout
    _runs(tmp_path, 2)
    for command in (("compare",), ("open", "--headless")):
        refused = _cli(*command, str(tmp_path), str(target))
        assert refused.returncode == 2 and refused.stdout == ""
        (line,) = refused.stderr.strip().splitlines()
        assert "holds 2 msit dumps" in line and "pass the one to compare" in line
