"""Whole small .pth files kept from their header read (engine/readers/load.py ``HELD``): the
payload ``load_flat`` slices from them equals the one it reads from disk, each is taken once,
and what is held stays bounded (large files are never held)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from layerwatch.engine.readers import pth
from layerwatch.engine.readers.load import HELD, load_flat
from layerwatch.engine.readers.pth import pth_locator


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    HELD.clear()
    pth._LAYOUTS.known.clear()
    pth._LAYOUTS.crcs.clear()
    yield
    HELD.clear()


TENSORS = {
    "f32": lambda: torch.randn(4, 8),
    "bf16": lambda: torch.randn(32).bfloat16(),
    "f16": lambda: torch.randn(6, 5).half(),
    "i64": lambda: torch.arange(40),
    "bool": lambda: torch.rand(9) > 0.5,
    "empty": lambda: torch.zeros(0, 3),
    "nonfinite": lambda: torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0]),
}


@pytest.mark.parametrize("name", sorted(TENSORS))
def test_held_bytes_give_what_the_disk_gives(tmp_path: Path, name: str) -> None:
    torch.manual_seed(0)
    path = tmp_path / f"{name}.pth"
    torch.save(TENSORS[name](), path)
    for _ in range(2):  # the full parse, then the learned layout: both keep the file
        loc = pth_locator(path)
        assert str(path) in HELD.files
        held = load_flat(loc)
        assert str(path) not in HELD.files  # taken once
        disk = load_flat(loc)  # nothing held now: read from the file
        assert held.dtype == disk.dtype
        np.testing.assert_array_equal(held, disk)  # NaN positions equal too
        assert held.tobytes() == disk.tobytes()


def test_large_files_are_not_held_and_the_total_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = tmp_path / "big.pth"
    torch.save(torch.zeros(1 << 15), big)  # 128 KiB of payload: read through the tail
    pth_locator(big)
    assert not HELD.files
    monkeypatch.setattr(HELD, "LIMIT", 3000)
    paths = []
    for i in range(6):
        paths.append(tmp_path / f"s{i}.pth")
        torch.save(torch.full((64,), float(i)), paths[-1])  # ~1.3 KB files
        pth_locator(paths[-1])
        assert HELD.held <= HELD.LIMIT
        assert HELD.held == sum(len(b) for b in HELD.files.values())
    assert list(HELD.files) == [str(p) for p in paths[-len(HELD.files) :]]  # oldest dropped
    assert float(load_flat(pth_locator(paths[0]))[0]) == 0.0  # a dropped one reads its file
