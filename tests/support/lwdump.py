"""Read a layerwatch-format dump in tests, straight from the files (no engine, no reader).

Used by the capture tests to check what the writer put on disk; other areas may use it to
inspect a dump they produced with ``layerwatch.capture``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch


def rank_dir(dump_path: Path) -> Path:
    """The single ``{device}_{pid}`` directory under ``dump_path``."""
    dirs = [p for p in Path(dump_path).iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def index(run_dir: Path) -> list[dict[str, Any]]:
    """Every complete index line, decoded."""
    text = (Path(run_dir) / "index.jsonl").read_text()
    assert text == "" or text.endswith("\n"), "index ends with a partial line"
    return [json.loads(line) for line in text.splitlines()]


def tensors(run_dir: Path) -> dict[tuple[int, str, str], dict[str, Any]]:
    """``K_TENSOR`` lines by ``(token, node, stem)`` (asserting there are no duplicates)."""
    found: dict[tuple[int, str, str], dict[str, Any]] = {}
    for line in index(run_dir):
        if line["k"] == "t":
            key = (line["token"], line["node"], line["stem"])
            assert key not in found, f"duplicate {key}"
            found[key] = line
    return found


def load(run_dir: Path, line: dict[str, Any]) -> torch.Tensor:
    """The tensor an index line points at, read from its absolute byte offsets."""
    raw = np.fromfile(
        Path(run_dir) / line["file"],
        dtype=np.uint8,
        count=line["end"] - line["begin"],
        offset=line["begin"],
    )
    assert raw.size == line["end"] - line["begin"], "payload truncated"
    dtype = getattr(torch, line["dtype"])
    if raw.size == 0:
        return torch.empty(line["shape"], dtype=dtype)
    return torch.from_numpy(raw.copy()).view(dtype).reshape(line["shape"])
