"""``layerwatch weights`` on a checkpoint pair of ≥ 2 GB: memory and throughput.

    OMP_NUM_THREADS=1 python tests/bench/bench_weights.py [--tensors 48] [--rows 4096] [--cols 2048]

Writes, in a temp dir deleted afterwards, a sharded fp32 golden (``--tensors`` tensors of
``rows × cols``, 1 GB shards with an index) and its bf16 cast as the target. Then, in fresh
child processes so that each peak RSS is its own:
* the load floor: read both checkpoints' files once (1 GB reads, nothing kept);
* the comparison (``compare_weights``), its peak RSS above the interpreter's after imports,
  checked against 2 × the largest tensor (as float32) + 200 MB.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD_COMPARE = """
import json, sys, time
import numpy  # no torch: safetensors sides never import it
from layerwatch.engine.weights import compare_weights
def hwm():  # VmHWM: this process's peak RSS (ru_maxrss would include the parent's, kept at fork)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1])
base = hwm()
t0 = time.perf_counter()
report = compare_weights(sys.argv[1], sys.argv[2])
dt = time.perf_counter() - t0
peak = hwm()
print(json.dumps({"s": dt, "base_mb": base / 1024, "peak_mb": peak / 1024,
                  "compared": len(report.rows), "failed": len(report.failures)}))
"""

CHILD_FLOOR = """
import sys, time, pathlib
t0 = time.perf_counter()
n = 0
for root in sys.argv[1:]:
    for f in sorted(pathlib.Path(root).iterdir()):
        with open(f, "rb", buffering=0) as fh:
            while chunk := fh.read(1 << 30):
                n += len(chunk)
print(time.perf_counter() - t0, n)
"""


def write_pair(root: Path, tensors: int, rows: int, cols: int) -> int:
    import torch
    from safetensors.torch import save_file

    per_shard = max(1, (1 << 30) // (rows * cols * 4))
    for side, dtype in (("golden", torch.float32), ("target", torch.bfloat16)):
        folder = root / side
        folder.mkdir()
        gen = torch.Generator().manual_seed(0)
        weight_map: dict[str, str] = {}
        shard: dict[str, torch.Tensor] = {}
        n_shards = (tensors + per_shard - 1) // per_shard
        for i in range(tensors):
            name = f"model.layers.{i}.mlp.down_proj.weight"
            shard[name] = (torch.randn(rows, cols, generator=gen) * 0.02).to(dtype)
            if len(shard) == per_shard or i == tensors - 1:
                file = (
                    f"model-{len(set(weight_map.values())) + 1:05d}-of-{n_shards:05d}.safetensors"
                )
                save_file(shard, str(folder / file))
                weight_map.update(dict.fromkeys(shard, file))
                shard = {}
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return sum(f.stat().st_size for f in root.rglob("*.safetensors"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tensors", type=int, default=48)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=2048)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="lw_bench_weights_"))
    try:
        total = write_pair(root, args.tensors, args.rows, args.cols)
        g, t = str(root / "golden"), str(root / "target")
        floor_s = float(
            subprocess.run(
                [sys.executable, "-c", CHILD_FLOOR, g, t],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()[0]
        )
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", CHILD_COMPARE, g, t], capture_output=True, text=True, check=True
        )
        wall = time.perf_counter() - t0
        res = json.loads(out.stdout)
        largest_mb = args.rows * args.cols * 4 / 2**20
        bound = 2 * largest_mb + 200
        grew = res["peak_mb"] - res["base_mb"]
        print(f"pair: {total / 1e9:.2f} GB on disk, {args.tensors} tensors of {largest_mb:.0f} MB")
        print(f"load floor (read both once): {floor_s:.2f} s = {total / 1e9 / floor_s:.2f} GB/s")
        print(
            f"weights compare: {res['s']:.2f} s = {total / 1e9 / res['s']:.2f} GB/s"
            f" ({res['s'] / floor_s:.1f}x the floor; {wall:.1f} s with start-up);"
            f" {res['compared']} compared, {res['failed']} failed"
        )
        print(
            f"peak RSS {res['peak_mb']:.0f} MB, {grew:.0f} MB above the {res['base_mb']:.0f} MB"
            f" after imports; bound 2 x largest + 200 MB = {bound:.0f} MB:"
            f" {'OK' if grew <= bound else 'OVER'}"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
