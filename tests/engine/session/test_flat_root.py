"""A 1-D root output is a plain tensor, never one vocabulary row (engine/numerics/logits.py's
``logits_shaped``); a real ``[positions, vocab]`` root output stays logits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from layerwatch.capture import DumpConfig, register_hook


class Scale(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2.0


class Root(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = Scale()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale(x) + 0.0


def dump(out: Path, shape: tuple[int, ...], noise: float) -> Path:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    x = x + noise * torch.randn(shape, generator=torch.Generator().manual_seed(1))
    model = Root()
    with register_hook(model, DumpConfig(dump_path=out)), torch.no_grad():
        model(x)
    return out


@pytest.mark.parametrize(("shape", "logits"), [((1 << 16,), False), ((2, 3, 1000), True)])
def test_root_output_is_logits_only_when_logits_shaped(
    tmp_path: Path, shape: tuple[int, ...], logits: bool
) -> None:
    golden, target = dump(tmp_path / "g", shape, 0.0), dump(tmp_path / "t", shape, 1e-4)
    done = subprocess.run(
        [sys.executable, "-m", "layerwatch.tui", "compare", str(golden), str(target), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    rows = {(r["node"], r["tensor"]): r for r in json.loads(done.stdout)["rows"]}
    root = rows["root", "output"] if ("root", "output") in rows else rows["root", "output_0"]
    assert ("kl_divergence" in root["metrics"]) == logits, root
