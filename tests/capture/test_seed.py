"""seed_all: msit's reproducibility switch, harmless on a CPU-only machine (own process: it is global)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

CHILD = """
import json, os, random
import numpy as np, torch
from layerwatch.capture import DumpConfig, register_hook, seed_all
from layerwatch.capture.demo import build_model, generate

def draw():
    return [random.random(), float(np.random.rand()), float(torch.rand(1))]

seed_all(42); a = draw()
seed_all(42); b = draw()
seed_all(43); c = draw()
model = build_model(layers=2)
handle = register_hook(model, DumpConfig(dump_path=os.environ["OUT"], seed=42))
d = draw()
ids = generate(model, new_tokens=3)[0].tolist()  # still runs with deterministic algorithms on
handle.close()
print(json.dumps({"same": a == b == d, "differs": a != c, "ids": ids,
                  "det": torch.are_deterministic_algorithms_enabled(),
                  "env": {k: os.environ.get(k) for k in ("PYTHONHASHSEED", "HCCL_DETERMINISTIC",
                          "LCCL_DETERMINISTIC", "ATB_MATMUL_SHUFFLE_K_ENABLE", "ATB_LLM_LCOC_ENABLE",
                          "CUBLAS_WORKSPACE_CONFIG")}}))
"""


def test_seed_all_repeats_draws_sets_determinism_and_keeps_cpu_runs_working(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OUT": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got["same"] and got["differs"] and got["det"] and len(got["ids"]) == 16 + 3
    assert got["env"] == {
        "PYTHONHASHSEED": "42",
        "HCCL_DETERMINISTIC": "true",
        "LCCL_DETERMINISTIC": "1",
        "ATB_MATMUL_SHUFFLE_K_ENABLE": "0",
        "ATB_LLM_LCOC_ENABLE": "0",
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    }
