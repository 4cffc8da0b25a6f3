"""Measure what `[weights.*]` limits in engine/thresholds.toml must separate.

For each target kind (fp16, bf16, int8 per-channel, fp8 per-tensor) and weight shapes from
64 to 4096 wide, Gaussian and heavy-tailed (Student t, 3 dof: outlier channels like trained
LLM weights), prints the worst benign value of each gate next to the mildest injected fault
(the tensor scaled by 1.03, or its scale off by 3 %). Run: ``python tests/bench/calibrate_weights.py``.
"""

from __future__ import annotations

import numpy as np
import torch
from layerwatch.engine.numerics.arrays import compare_arrays

SHAPES = [(64, 64), (256, 64), (1024, 1024), (4096, 512), (512, 4096)]


def convert(w: torch.Tensor, kind: str) -> torch.Tensor:
    if kind in ("fp16", "bf16"):
        return w.to(torch.float16 if kind == "fp16" else torch.bfloat16).float()
    if kind == "int8":
        scale = w.abs().amax(1, keepdim=True) / 127
        return torch.clamp(torch.round(w / scale), -127, 127) * scale
    scale = w.abs().max() / 448
    return (w / scale).to(torch.float8_e4m3fn).float() * scale


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    print(
        f"{'kind':5} {'benign max RED':>15} {'max norm_err':>13} {'min cos':>12} {'fault n_err':>11}"
    )
    for kind in ("fp16", "bf16", "int8", "fp8"):
        red, nerr, cos, fault = 0.0, 0.0, 1.0, np.inf
        for shape in SHAPES:
            for dist in ("normal", "t3"):
                w = torch.randn(shape, generator=gen) * 0.02
                if dist == "t3":
                    w = torch.distributions.StudentT(3.0).sample(shape) * 0.02
                m = compare_arrays(w.numpy(), convert(w, kind).numpy(), rel_floor=1e-6)
                red = max(red, m["relative_euclidean_distance"])
                nerr = max(nerr, m["norm_relative_error"])
                cos = min(cos, m["cosine_similarity"])
                bad = compare_arrays(w.numpy(), (convert(w, kind) * 1.03).numpy(), rel_floor=1e-6)
                fault = min(fault, bad["norm_relative_error"])
        print(f"{kind:5} {red:15.3g} {nerr:13.3g} {cos:12.7f} {fault:11.3g}")


if __name__ == "__main__":
    main()
