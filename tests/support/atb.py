"""Write ATB dumps as the CANN probe does (``.bin`` tensors + topology json), for tests.

Used by the readers' tests and by the live stand-in ``msit`` executable (there is no NPU here).
The byte layout follows CANN ``Mki::BinFile::Write`` (header lines ``key=value``, ``$End=1``, then
the payload) and the directory layout of msit's ATB dump:
``{out}/tensors/{device}_{pid}/{executeCount}/{order}_{OpType}/.../{before|after}/{in|out}tensor{i}.bin``
and ``{out}/model/{pid}/{ModelName}.json``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ACL = {
    "float32": 0, "float16": 1, "int8": 2, "int32": 3, "uint8": 4, "int16": 6, "uint16": 7,
    "uint32": 8, "int64": 9, "uint64": 10, "float64": 11, "bool": 12, "complex64": 16,
    "complex128": 17, "bfloat16": 27,
}  # fmt: skip
FORMAT_ND = 2
FORMAT_NZ = 29


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 → bfloat16 bit patterns (round to nearest even), as uint16."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def to_nz(nd: np.ndarray, n0: int | None = None) -> np.ndarray:
    """ND (…, M, N) → FRACTAL_NZ (B, N1, Mp, N0): pad M to 16 and N to N0, then block."""
    n0 = n0 or max(1, 32 // nd.dtype.itemsize)
    *lead, m, n = nd.shape
    batch = int(np.prod(lead)) if lead else 1
    mp, n1 = -(-m // 16) * 16, -(-n // n0)
    padded = np.zeros((batch, mp, n1 * n0), nd.dtype)
    padded[:, :m, :n] = nd.reshape(batch, m, n)
    return np.ascontiguousarray(padded.reshape(batch, mp, n1, n0).transpose(0, 2, 1, 3))


def bin_bytes(
    payload: bytes | None, dtype_code: int, dims: Sequence[int], fmt: int = FORMAT_ND,
    extra: dict[str, str] | None = None,
) -> bytes:  # fmt: skip
    """One ``.bin`` file as the probe writes it (``payload=None``: description only)."""
    lines = ["$Version=1.0", f"$Object.Count={1 if payload is not None else 0}"]
    lines.append(f"$Object.Length={len(payload) if payload is not None else 0}")
    lines += [f"format={fmt}", f"dtype={dtype_code}", "dims=" + ",".join(str(int(d)) for d in dims)]
    lines += [f"{k}={v}" for k, v in (extra or {}).items()]
    if payload is not None:
        lines.append(f"$Object.data=0,{len(payload)}")
    lines.append("$End=1")
    return ("\n".join(lines) + "\n").encode() + (payload or b"")


def write_bin(
    path: str | os.PathLike[str], array: np.ndarray, *, dtype: str | None = None,
    fmt: int = FORMAT_ND, dims: Sequence[int] | None = None, code: int | None = None,
) -> Path:  # fmt: skip
    """Write ``array`` as an ATB tensor file. ``dtype="bfloat16"`` converts float32 values
    (or takes uint16 bit patterns as is); ``code`` forces any aclDataType code."""
    name = dtype or array.dtype.name
    if name == "bfloat16":
        payload = (array if array.dtype == np.uint16 else bf16_bits(array)).astype("<u2")
    else:
        payload = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"))
    data = bin_bytes(
        payload.tobytes(), ACL[name] if code is None else code,
        array.shape if dims is None else dims, fmt,
    )  # fmt: skip
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(".tmp-" + out.name)
    tmp.write_bytes(data)
    os.replace(tmp, out)
    return out


@dataclass
class Op:
    """One ATB operation: its type, tensors, and child operations (a graph node)."""

    op_type: str
    inputs: list[np.ndarray] = field(default_factory=list)
    outputs: list[np.ndarray] = field(default_factory=list)
    children: list[Op] = field(default_factory=list)
    dtype: str | None = None
    """Write float tensors as this dtype (``bfloat16``/``float16``), else as they are."""

    def topology(self, index: int, name: str) -> dict:
        return {
            "opName": f"{self.op_type}_{index}", "opType": self.op_type, "param": {},
            "inTensors": [f"{name}_in{i}" for i in range(len(self.inputs))],
            "outTensors": [f"{name}_out{i}" for i in range(len(self.outputs))],
            "nodes": [c.topology(i, f"{name}_{i}") for i, c in enumerate(self.children)],
        }  # fmt: skip


def write_op(op_dir: Path, op: Op, *, where: str = "both") -> None:
    """Children first (they finish first), then this op's before/after tensors."""
    for i, child in enumerate(op.children):
        write_op(op_dir / f"{i}_{child.op_type}", child, where=where)
    for i, t in enumerate(op.inputs):
        dtype = op.dtype if op.dtype and t.dtype.kind == "f" else None
        write_bin(op_dir / "before" / f"intensor{i}.bin", t, dtype=dtype)
    for i, t in enumerate(op.outputs):
        dtype = op.dtype if op.dtype and t.dtype.kind == "f" else None
        write_bin(op_dir / "after" / f"outtensor{i}.bin", t, dtype=dtype)


def write_dump(
    out: str | os.PathLike[str], tokens: Sequence[Sequence[Op]], *, model: str = "LlamaModel",
    device: int = 0, pid: int = 4242,
) -> Path:  # fmt: skip
    """A whole ATB dump: ``tokens[t]`` = the top-level ops run at execute count t."""
    root = Path(out)
    rank = root / "tensors" / f"{device}_{pid}"
    for t, ops in enumerate(tokens):
        for i, op in enumerate(ops):
            write_op(rank / str(t) / f"{i}_{op.op_type}", op)
    topo = {
        "modelName": model, "inTensors": [], "outTensors": [],
        "nodes": [op.topology(i, f"n{i}") for i, op in enumerate(tokens[0])] if tokens else [],
    }  # fmt: skip
    model_dir = root / "model" / str(pid)
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / f"{model}.json").write_text(json.dumps(topo, indent=1))
    return root
