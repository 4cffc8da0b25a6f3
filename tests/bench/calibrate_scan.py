"""Headroom of ``layerwatch scan``'s jump rule on benign runs (engine/numerics/anomaly.py).

Captures tiny random-weight Llama, Qwen2 and GPT-2 models in fp32, fp16 and bf16 and prints,
per run, the largest output/input magnitude ratio and the largest output magnitude any node
shows, with where. The bound in anomaly.py must sit well above every ratio printed here.

    OMP_NUM_THREADS=1 python tests/bench/calibrate_scan.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from layerwatch.engine.scan import scan_dump
from support import tiny_hf


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for arch in tiny_hf.ARCHS:
            for dtype in (torch.float32, torch.float16, torch.bfloat16):
                out = Path(tmp) / f"{arch}-{dtype}"
                run = tiny_hf.capture(tiny_hf.build(arch, dtype), out)
                report = scan_dump(str(run))
                ratio, rkey = report.peak_ratio
                mag, mkey = report.peak_magnitude
                print(
                    f"{arch:6} {str(dtype)[6:]:9} anomalies {len(report.rows)}  "
                    f"peak ratio {ratio:7.2f} ({rkey.node} {rkey.stem})  "
                    f"peak |x| {mag:7.2f} ({mkey.node})"
                )


if __name__ == "__main__":
    main()
