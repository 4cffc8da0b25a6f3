"""capture/atomic.py: the one temp-file-and-rename helper every writer uses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from layerwatch.capture.atomic import TMP_PREFIX, replacing, temp_path, write_text


def test_replacing_swaps_in_the_whole_file_only_at_the_end(tmp_path: Path) -> None:
    target = tmp_path / "manifest.json"
    target.write_text("old")
    with replacing(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name == TMP_PREFIX + "manifest.json"
        tmp.write_text("new")
        assert target.read_text() == "old"  # a reader still sees the old file
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "report.csv"
    target.write_text("old")
    with pytest.raises(RuntimeError), replacing(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("disk full")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.csv"]


def test_an_os_error_names_the_target(tmp_path: Path) -> None:
    target = tmp_path / "missing" / "r.csv"
    with pytest.raises(FileNotFoundError) as info:
        write_text(target, "x")
    assert info.value.filename in (str(target), str(temp_path(target)))


def test_unique_temp_names_carry_the_pid(tmp_path: Path) -> None:
    assert temp_path(tmp_path / "a.npy", unique=True).name == f"{TMP_PREFIX}{os.getpid()}-a.npy"
    write_text(tmp_path / "a.txt", "line\n", newline="")
    assert (tmp_path / "a.txt").read_bytes() == b"line\n"
