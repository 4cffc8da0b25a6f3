"""A real failure inside the engine's worker, from a corrupt file rather than a patch.

Two captures of a tiny model with their weights (``DumpConfig(dump_weight=True)``); the
golden data file is then cut short where the weights begin. Pairing by weights
(``--auto-map``) reads them inside ``session.flush()`` and raises ``LayerwatchError``
(truncated) — every later flush would too. Used by the live and the TUI tests of how a
front end ends when the comparison gives up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CAPTURE = """
import sys, torch
from torch import nn
from layerwatch.capture import DumpConfig, register_hook

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
if sys.argv[2] == "fault":
    with torch.no_grad():
        model[2].weight.mul_(1.5)
with register_hook(model, DumpConfig(dump_path=sys.argv[1], dump_weight=True)), torch.no_grad():
    for _ in range(2):
        model(torch.ones(1, 8))
"""


def truncated_weight_dumps(root: Path) -> tuple[Path, Path]:
    """Golden and target captures under ``root``; the golden's weights are cut off."""
    golden, target = root / "golden", root / "target"
    for path, how in ((golden, "ok"), (target, "fault")):
        subprocess.run([sys.executable, "-c", CAPTURE, str(path), how], check=True, timeout=120)
    lines = [
        json.loads(line) for line in next(golden.glob("*/index.jsonl")).read_text().splitlines()
    ]
    weights = [line for line in lines if line["k"] == "weight"]
    assert weights, "the capture dumped no weights"
    data = next(golden.glob("*/")) / weights[0]["file"]
    os.truncate(data, weights[0]["begin"])  # the weights (and what follows them) are gone
    return golden, target
