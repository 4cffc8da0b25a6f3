"""Helpers for the readers' tests: a layerwatch dump written by hand per capture/format.py."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from layerwatch.capture import format as lwf
from safetensors.numpy import save_file

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


class HandDump:
    """Writes a layerwatch rank directory exactly as the format says (data first, then index)."""

    def __init__(self, run_dir: Path, rank: str = "cpu_100") -> None:
        self.dir = run_dir / rank
        (self.dir / lwf.DATA_DIR).mkdir(parents=True, exist_ok=True)
        self.seq = 0
        self.arrays: dict[tuple[int, str, str], np.ndarray] = {}
        lwf.write_json_atomic(
            self.dir / lwf.MANIFEST, {"format": "layerwatch", "status": "running"}
        )

    def batch(self, items: list[tuple[int, str, str, np.ndarray]], *, order: int = 0) -> str:
        """Write one data file and return the index lines for it (not yet appended)."""
        rel = lwf.data_file_name(self.seq)
        self.seq += 1
        tensors = {lwf.tensor_name(t, n, s): a for t, n, s, a in items}
        tmp = self.dir / (lwf.TMP_PREFIX + "x")
        save_file(tensors, str(tmp))
        os.replace(tmp, self.dir / rel)
        raw = (self.dir / rel).read_bytes()
        (hlen,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + hlen])
        lines = []
        for i, (t, n, s, a) in enumerate(items):
            begin, end = header[lwf.tensor_name(t, n, s)]["data_offsets"]
            entry = lwf.IndexTensor(
                t, n, s, str(a.dtype), a.shape, rel, 8 + hlen + begin, 8 + hlen + end,
                order + i, "Linear",
                {"max": float(a.max()), "min": float(a.min()), "mean": float("nan"), "norm": 1.0,
                 "nan": 0, "inf": 0},
            )  # fmt: skip
            self.arrays[(t, n, s)] = a
            lines.append(lwf.encode_line(entry.to_json()))
        return "".join(lines)

    def append(self, text: str) -> None:
        with open(self.dir / lwf.INDEX, "a", encoding="utf-8") as fh:
            fh.write(text)

    def token(self, token: int, ids: list[int]) -> None:
        self.append(lwf.encode_line({"k": lwf.K_TOKEN, "token": token, "input_ids": ids}))

    def end(self, status: str = lwf.STATUS_COMPLETE) -> None:
        self.append(lwf.encode_line({"k": lwf.K_END, "status": status}))

    def topology(self) -> None:
        lwf.write_json_atomic(self.dir / lwf.TOPOLOGY, {
            "format": "layerwatch-topology", "version": 1, "root": "root",
            "nodes": [
                {"name": "root", "type": "Tiny", "parent": None, "order": 2},
                {"name": "root.a", "type": "Linear", "parent": "root", "order": 0,
                 "params": {"weight": {"shape": [2, 2], "dtype": "float32", "sum": 1.0,
                                       "abs_sum": 2.0, "norm": 3.0, "head": [0.5, -0.5]}}},
                {"name": "root.b", "type": "ReLU", "parent": "root", "order": 1},
            ],
        })  # fmt: skip


@pytest.fixture
def hand_dump(tmp_path: Path) -> HandDump:
    return HandDump(tmp_path / "run")
