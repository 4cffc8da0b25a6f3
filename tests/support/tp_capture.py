"""Real tensor-parallel captures: tests/support/tp_model.py under ``torchrun`` (2 ranks, gloo).

Shared by tests/engine/test_tensor_parallel.py and tests/engine/test_ray_compare.py: the
single-card golden, a benign TP=2 run under ``layerwatch dump`` (no code change), and two
faults captured with ``register_hook`` (``allreduce``: rank 1's all-reduce result corrupted by
the program's own wrapper at layer 1, token 1; ``shard``: rank 1 loads rank 0's ``up`` shard).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TP_MODEL = Path(__file__).parent / "tp_model.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
CAPTURES = ("golden", "benign", "allreduce", "shard")


def run_checked(cmd: list[str]) -> None:
    done = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def capture_tp_dumps(root: Path, names: tuple[str, ...] = CAPTURES) -> dict[str, Path]:
    """The captures ``names`` (of :data:`CAPTURES`) under ``root``, by name."""
    out = {name: root / name for name in names}
    if "golden" in out:
        run_checked([sys.executable, str(TP_MODEL), str(out["golden"])])
    if "benign" in out:
        lw = [sys.executable, "-m", "layerwatch.tui", "dump", "--out", str(out["benign"]), "--"]
        run_checked([*lw, *TORCHRUN, str(TP_MODEL), str(root / "unused"), "--hook", "none"])
    for fault in ("allreduce", "shard"):
        if fault in out:
            run_checked([*TORCHRUN, str(TP_MODEL), str(out[fault]), "--fault", fault])
    return out
