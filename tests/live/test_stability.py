"""Framing checks on real files of each format, cut at every interesting point."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from layerwatch.capture.stability import Completeness, check_file
from safetensors.numpy import save_file


def _cuts(data: bytes) -> list[int]:
    """Prefix lengths to try: the edges and a spread through the middle."""
    n = len(data)
    return sorted(
        {0, 1, 4, 8, 21, 22, n // 3, n // 2, n - 23, n - 22, n - 21, n - 2, n - 1} - {n}
        & set(range(n))
    )


def _assert_framed(path: Path, tmp_path: Path) -> None:
    data = path.read_bytes()
    assert check_file(path).state is Completeness.COMPLETE
    for cut in _cuts(data):
        partial = tmp_path / f"cut{cut}{path.suffix}"
        partial.write_bytes(data[:cut])
        check = check_file(partial)
        assert check.state is Completeness.INCOMPLETE, (cut, len(data))
        assert check.reason


def test_torch_save_zip(tmp_path: Path) -> None:
    path = tmp_path / "output.pth"
    torch.save(torch.arange(3000, dtype=torch.float32).reshape(30, 100), path)
    _assert_framed(path, tmp_path)
    pt = tmp_path / "x.pt"
    torch.save({"a": torch.ones(3)}, pt)
    assert check_file(pt).state is Completeness.COMPLETE


def test_legacy_torch_pickle_has_no_framing(tmp_path: Path) -> None:
    path = tmp_path / "old.pth"
    torch.save(torch.ones(4), path, _use_new_zipfile_serialization=False)
    assert check_file(path).state is Completeness.UNKNOWN


def _atb(payload: bytes, **extra: str) -> bytes:
    lines = [
        "$Version=1.0",
        "$Object.Count=1",
        f"$Object.Length={len(payload)}",
        "format=2",
        "dtype=0",
    ]
    lines += [f"{k}={v}" for k, v in extra.items()]
    lines += [f"dims={len(payload) // 4}", f"$Object.data=0,{len(payload)}", "$End=1"]
    return ("\n".join(lines) + "\n").encode() + payload


def test_atb_bin(tmp_path: Path) -> None:
    path = tmp_path / "outtensor0.bin"
    path.write_bytes(_atb(np.arange(500, dtype=np.float32).tobytes()))
    _assert_framed(path, tmp_path)


def test_atb_bin_without_length_uses_dims(tmp_path: Path) -> None:
    payload = np.ones((4, 8), dtype=np.float16).tobytes()
    header = b"$Version=1.0\nformat=2\ndtype=1\ndims=4,8\n$End=1\n"
    path = tmp_path / "intensor1.bin"
    path.write_bytes(header + payload)
    assert check_file(path).state is Completeness.COMPLETE
    path.write_bytes(header + payload[:-1])
    assert (
        check_file(path).reason
        == f"{len(header) + len(payload) - 1} of {len(header) + len(payload)} bytes"
    )


def test_atb_statistics_bin_is_header_only(tmp_path: Path) -> None:
    path = tmp_path / "outtensor0.bin"
    path.write_bytes(
        b"format=2\ntype=0\ndims=2,2\nmax=1.0\nmin=0.0\nmean=0.5\nl2norm=1.0\n$End=1\n"
    )
    assert check_file(path).state is Completeness.COMPLETE
    path.write_bytes(b"format=2\ntype=0\ndims=2,2\nmax=1.0\n")
    assert check_file(path).state is Completeness.INCOMPLETE


def test_safetensors(tmp_path: Path) -> None:
    path = tmp_path / "00000001.safetensors"
    save_file({"a": np.ones((10, 10), np.float32), "b": np.zeros(7, np.int64)}, str(path))
    _assert_framed(path, tmp_path)


def test_json_including_msprobe_nan(tmp_path: Path) -> None:
    path = tmp_path / "dump.json"
    path.write_text('{"task": "statistics", "data": {"x": {"Max": NaN, "Min": -Infinity}}}')
    assert check_file(path).state is Completeness.COMPLETE
    path.write_text(json.dumps({"task": "x", "data": {"a": [1, 2, 3]}})[:-3])
    assert check_file(path).state is Completeness.INCOMPLETE


def test_npy(tmp_path: Path) -> None:
    path = tmp_path / "x.npy"
    np.save(path, np.arange(1000, dtype=np.float64).reshape(10, 100))
    _assert_framed(path, tmp_path)


@pytest.mark.parametrize("name", ["statistics.csv", "notes.txt", "weird"])
def test_no_framing_is_unknown(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text("a,b\n1,2\n")
    assert check_file(path).state is Completeness.UNKNOWN


def test_missing_file_is_incomplete(tmp_path: Path) -> None:
    assert check_file(tmp_path / "nope.pth").state is Completeness.INCOMPLETE
