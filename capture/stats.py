"""Per-tensor statistics, computed where the tensors live, a batch at a time.

``max min mean norm`` are over the *finite* elements; ``nan``/``inf`` count the rest. The
writer thread calls :func:`batch_stats` once per batch, so the per-tensor cost is a share of a
few vectorised operations rather than six torch calls per tensor:

* host copies (numpy arrays, see ``capture/recorder.py``): small ones are concatenated into one
  float64 buffer and reduced per segment (``np.maximum.reduceat``...); large ones are reduced
  one by one with torch's fast kernels on a zero-copy view;
* device tensors stay on their device: small ones are concatenated and reduced per segment
  with ``torch.segment_reduce`` (sums in float64), large ones one by one, and a device's
  results come back to the host with one ``.tolist()``: statistics-only dumps move a few numbers
  per tensor, never the payload.

torch is imported only where a tensor needs it (device tensors, large or non-finite host
arrays, fp8): the writer process (``capture/writer_process.py``) reduces small host arrays with
numpy alone and never pays torch's import. ``dtypes`` are names (``float32``, ``bfloat16``).

Large float tensors use float32 kernels (``sum``/``vector_norm`` accumulate with cascade or
blocked summation, ``aminmax`` is exact). A tensor whose sum or norm is not finite (it holds
NaN/Inf, or its squares overflow) is redone exactly on its finite part, so the fast path never
hides a non-finite value.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch
    from torch import Tensor
StatsRow = tuple[float, float, float, float, int, int]
"""``(max, min, mean, norm, nan, inf)``."""
SMALL = 1 << 15
"""Tensors with fewer elements than this are reduced together in one segmented pass."""
_NAN = float("nan")


def as_torch(data: Any, dtype: torch.dtype | str) -> Tensor:
    """A tensor view of a captured copy (numpy bits of bf16/fp8 are viewed back as ``dtype``,
    a torch dtype or its name)."""
    if not isinstance(data, np.ndarray):
        return data
    import torch

    want: torch.dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    t = torch.from_numpy(data)
    return t if t.dtype == want else t.view(want)


def _host_float(data: np.ndarray, dtype: str) -> np.ndarray:
    """Values of a host copy as a flat numpy float array (bf16 widened exactly)."""
    flat = data.reshape(-1)
    if dtype == "bfloat16":
        return (flat.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    if flat.dtype.kind in "fiub":
        return flat
    return as_torch(data, dtype).reshape(-1).float().numpy()  # fp8 and other exotic types


def batch_stats(datas: Sequence[Any], dtypes: Sequence[str]) -> list[StatsRow]:
    """Statistics of each captured copy (numpy array or device tensor; ``dtypes``: the
    captured tensors' dtype names), in order."""
    rows: list[StatsRow | None] = [None] * len(datas)
    host_small: list[int] = []
    groups: dict[Any, list[int]] = {}
    for i, data in enumerate(datas):
        n = data.size if isinstance(data, np.ndarray) else data.numel()
        if n == 0:
            rows[i] = (_NAN, _NAN, _NAN, 0.0, 0, 0)
        elif isinstance(data, np.ndarray) and n < SMALL:
            host_small.append(i)
        else:
            key = "cpu" if isinstance(data, np.ndarray) else data.device
            groups.setdefault(key, []).append(i)
    found: list[tuple[int, list[float]]] = []
    if host_small:
        _finish_host(rows, host_small, datas, dtypes)
    for idx in groups.values():
        small = [
            i for i in idx if not isinstance(datas[i], np.ndarray) and datas[i].numel() < SMALL
        ]
        chosen = set(small)
        large = [i for i in idx if i not in chosen]
        import torch

        parts: list[Tensor] = []
        if small:
            parts.append(_device_segmented([datas[i] for i in small]))
        parts.extend(_one(as_torch(datas[i], dtypes[i])) for i in large)
        found += zip(small + large, torch.cat(parts).reshape(-1, 4).tolist(), strict=True)
    for i, (mx, mn, total, sumsq) in found:
        if math.isfinite(total) and math.isfinite(sumsq):
            n = datas[i].size if isinstance(datas[i], np.ndarray) else datas[i].numel()
            rows[i] = (mx, mn, total / n, math.sqrt(max(sumsq, 0.0)), 0, 0)
        else:
            rows[i] = exact_stats(as_torch(datas[i], dtypes[i]))
    return rows  # type: ignore[return-value]


_NARROW = frozenset(np.dtype(c) for c in ("float16", "float32", "int8", "uint8", "int16", "bool"))
"""numpy dtypes exactly representable in float32: such batches are reduced in float32."""
_WIDEN = frozenset({"bfloat16", "float8_e4m3fn", "float8_e5m2"})


def _finish_host(
    rows: list[StatsRow | None],
    idx: list[int],
    datas: Sequence[Any],
    dtypes: Sequence[str],
) -> None:
    """Rows of the small host arrays ``idx``: mean and norm for all of them in a few array
    operations (the same float64 division and square root the per-row path does), rows that
    are not finite redone exactly."""
    sums, sizes = _host_segmented([datas[i] for i in idx], [dtypes[i] for i in idx])
    total, sumsq = sums[:, 2], sums[:, 3]
    with np.errstate(all="ignore"):
        good = (np.isfinite(total) & np.isfinite(sumsq)).tolist()
        mean = total / np.asarray(sizes, dtype=np.float64)
        norm = np.sqrt(np.maximum(sumsq, 0.0))
    zero = itertools.repeat(0)  # nan, inf: a finite row counts none
    done = zip(
        sums[:, 0].tolist(),
        sums[:, 1].tolist(),
        mean.tolist(),
        norm.tolist(),
        zero,
        zero,
        strict=False,
    )
    for i, row, ok in zip(idx, done, good, strict=True):
        rows[i] = row if ok else _exact_host(datas[i], dtypes[i])


def _host_segmented(arrays: list[np.ndarray], dtypes: list[str]) -> tuple[np.ndarray, list[int]]:
    """``[k, 4]`` float64 rows of max, min, sum, sum of squares per small host array (sums
    accumulate in float64), and the arrays' sizes."""
    if _WIDEN.isdisjoint(dtypes):
        flats = arrays
    else:
        flats = [
            _host_float(a, dt) if dt in _WIDEN else a for a, dt in zip(arrays, dtypes, strict=True)
        ]
    sizes = [a.size for a in flats]
    starts = np.zeros(len(flats), dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    narrow = {a.dtype for a in flats} <= _NARROW
    buf = np.concatenate(
        flats, axis=None, dtype=np.float32 if narrow else np.float64, casting="unsafe"
    )
    with np.errstate(all="ignore"):
        out = np.stack(
            [
                np.maximum.reduceat(buf, starts).astype(np.float64),
                np.minimum.reduceat(buf, starts).astype(np.float64),
                np.add.reduceat(buf, starts, dtype=np.float64),
                np.add.reduceat(np.square(buf), starts, dtype=np.float64),
            ],
            axis=1,
        )
    return out, sizes


def _device_segmented(tensors: list[Tensor]) -> Tensor:
    """``[k, 4]`` rows of max, min, sum, sum of squares (float64) for k small device tensors."""
    import torch

    flat = [t.reshape(-1) for t in tensors]
    try:
        lengths = torch.tensor([f.numel() for f in flat], device=flat[0].device)
        buf = torch.cat(flat)
        if buf.dtype in (torch.float16, torch.bfloat16) or not buf.is_floating_point():
            buf = buf.float()
        wide = buf.double()
        out = torch.stack(
            [
                torch.segment_reduce(buf, "max", lengths=lengths, unsafe=True).double(),
                torch.segment_reduce(buf, "min", lengths=lengths, unsafe=True).double(),
                torch.segment_reduce(wide, "sum", lengths=lengths, unsafe=True),
                torch.segment_reduce(wide * wide, "sum", lengths=lengths, unsafe=True),
            ],
            dim=1,
        )
        return out.reshape(-1)
    except (RuntimeError, NotImplementedError):  # a backend without segment_reduce
        return torch.cat([_one(t) for t in tensors])


def _one(t: Tensor) -> Tensor:
    """max, min, sum, sum of squares of one tensor as a 4-element float64 tensor."""
    import torch

    low = (torch.float16, torch.bfloat16)
    flat = t.reshape(-1)
    if not flat.is_floating_point():
        flat = flat.double() if flat.dtype in (torch.int64, torch.int32) else flat.float()
    elif flat.dtype not in (torch.float32, torch.float64, *low):
        flat = flat.float()
    acc = torch.float32 if flat.dtype in low else None
    mn, mx = torch.aminmax(flat)
    total = flat.sum(dtype=acc)
    norm = torch.linalg.vector_norm(flat, dtype=acc)
    return torch.stack([mx.double(), mn.double(), total.double(), norm.double().square()])


def _exact_host(data: np.ndarray, dtype: str) -> StatsRow:
    """:func:`exact_stats` of a small host array in numpy (float64 sums over the finite part):
    a Llama's attention mask holds ``finfo.min``, whose float32 square overflows, at every
    token, and torch's import would cost the writer process 1.7 s of CPU."""
    flat = _host_float(data, dtype)
    if flat.dtype != np.float64:
        flat = flat.astype(np.float32)
    with np.errstate(all="ignore"):
        finite = np.isfinite(flat)
        nan = int(np.isnan(flat).sum())
        inf = int(flat.size - int(finite.sum()) - nan)
        part = flat[finite].astype(np.float64)
        if part.size == 0:
            return (_NAN, _NAN, _NAN, 0.0, nan, inf)
        return (
            float(part.max()),
            float(part.min()),
            float(part.sum()) / part.size,
            math.sqrt(float(np.dot(part, part))),
            nan,
            inf,
        )


def exact_stats(t: Tensor) -> StatsRow:
    """The slow, exact path: statistics of the finite part, counts of NaN and Inf."""
    import torch

    flat = t.reshape(-1)
    if flat.dtype != torch.float64:
        flat = flat.float()
    finite = torch.isfinite(flat)
    nan = int(torch.isnan(flat).sum())
    inf = int(flat.numel() - int(finite.sum()) - nan)
    part = flat[finite].double()
    if part.numel() == 0:
        return (_NAN, _NAN, _NAN, 0.0, nan, inf)
    mn, mx = torch.aminmax(part)
    total = float(part.sum())
    return (
        float(mx),
        float(mn),
        total / part.numel(),
        float(torch.linalg.vector_norm(part)),
        nan,
        inf,
    )
