"""``seed_all(seed)``: msit's reproducibility switch, safe on a CPU-only machine.

Seeds Python, NumPy and torch (and CUDA / Ascend NPU when they are present), sets
``PYTHONHASHSEED``, asks torch for deterministic algorithms (``warn_only=True``: an operator
without a deterministic version warns instead of failing the run) and exports the determinism
switches msit sets for cuDNN/cuBLAS and Ascend (HCCL, LCCL, ATB).
"""

from __future__ import annotations

import contextlib
import os
import random
import sys

DETERMINISM_ENV = {
    "PYTHONHASHSEED": None,  # filled with the seed
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "HCCL_DETERMINISTIC": "true",
    "LCCL_DETERMINISTIC": "1",
    "ATB_MATMUL_SHUFFLE_K_ENABLE": "0",
    "ATB_LLM_LCOC_ENABLE": "0",
}
"""Environment variables set by :func:`seed_all` (as msit's ``seed_all`` does)."""


def seed_all(seed: int = 1234) -> None:
    """Make a run repeatable: same seed, same numbers (where the hardware allows)."""
    import numpy as np
    import torch

    from .errors import LayerwatchError

    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32:
        raise LayerwatchError(f"seed must be an integer in [0, 2**32), got {seed!r}")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    for name, value in DETERMINISM_ENV.items():
        os.environ[name] = str(seed) if value is None else value
    torch.use_deterministic_algorithms(True, warn_only=True)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    npu = sys.modules.get("torch_npu")  # only if the user's program already imported it
    if npu is not None:
        with contextlib.suppress(Exception):
            npu.npu.manual_seed_all(seed)
