"""A synthetic tensor-parallel dump for the all-reduce check, written without torch.

``rank{r}/`` in the layerwatch format (capture/format.py): one raw payload file per rank,
index lines of type ``all_reduce``, the ``collective`` op lines, manifests with rank and world
size. Used by tests/engine/test_allreduce.py and tests/bench/bench_allreduce.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

REDUCE = {"SUM": np.sum, "MAX": np.max, "MIN": np.min, "AVG": np.mean, "PRODUCT": np.prod}


def write_allreduce_dump(
    root: Path,
    ranks: int,
    calls: int,
    elems: int,
    dtype: str = "float32",
    *,
    op: str = "SUM",
    bad: tuple[int, int] | None = None,
) -> int:
    """``rank{r}/`` directories of ``calls`` all-reduce calls (4 layers a token) whose outputs
    are the true reduction ``op``, except rank ``bad[1]``'s at call ``bad[0]`` (× 1.05);
    returns the bytes of every input and output payload."""
    rng = np.random.default_rng(0)
    store = np.float32 if dtype == "float32" else np.uint16
    total = 0
    for r in range(ranks):
        (root / f"rank{r}").mkdir()
    files = {r: open(root / f"rank{r}" / "data.bin", "wb") for r in range(ranks)}  # noqa: SIM115
    lines: dict[int, list[str]] = {r: [] for r in range(ranks)}
    offsets = dict.fromkeys(range(ranks), 0)
    for c in range(calls):
        inputs = [rng.standard_normal(elems, dtype=np.float32) for _ in range(ranks)]
        out = REDUCE[op](np.stack(inputs).astype(np.float64), axis=0).astype(np.float32)
        for r in range(ranks):
            result = out * np.float32(1.05) if bad == (c, r) else out
            for stem, x in (("input_0", inputs[r]), ("output", result)):
                raw = x if store is np.float32 else (x.view(np.uint32) >> 16).astype(np.uint16)
                begin = offsets[r]
                files[r].write(raw.tobytes())
                offsets[r] += raw.nbytes
                total += raw.nbytes
                line = {
                    "k": "t",
                    "token": c // 4,
                    "node": f"root.layers.{c % 4}.down.all_reduce.0",
                    "stem": stem,
                    "type": "all_reduce",
                    "order": c % 4,
                    "dtype": dtype,
                    "shape": [elems],
                    "file": "data.bin",
                    "begin": begin,
                    "end": begin + raw.nbytes,
                    "stats": None,
                }
                lines[r].append(json.dumps(line))
            lines[r].append(
                json.dumps(
                    {
                        "k": "collective",
                        "token": c // 4,
                        "node": f"root.layers.{c % 4}.down.all_reduce.0",
                        "type": "all_reduce",
                        "op": op,
                        "world_size": ranks,
                        "rank": r,
                    }
                )
            )
    for r in range(ranks):
        files[r].close()
        lines[r].append(json.dumps({"k": "end", "status": "complete"}))
        (root / f"rank{r}" / "index.jsonl").write_text("\n".join(lines[r]) + "\n")
        manifest = {"format": "layerwatch", "status": "complete", "rank": r, "world_size": ranks}
        (root / f"rank{r}" / "manifest.json").write_text(json.dumps(manifest))
    return total
