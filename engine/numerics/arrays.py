"""Metrics of a pair held in memory (numpy arrays or torch tensors), for scripts and tests.

The same numbers as a dump's pair: small float pairs go through :mod:`.segments`, the rest
through the streaming :class:`~.metrics.MetricAccumulator`, logits add :mod:`.logits`. Kept
out of :mod:`.metrics` because it sits above :mod:`.segments`, which builds on the accumulator.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.numerics import fused
from layerwatch.engine.numerics.logits import logits_metrics
from layerwatch.engine.numerics.metrics import MetricAccumulator
from layerwatch.engine.numerics.segments import SMALL, small_metrics
from layerwatch.engine.numerics.thresholds import Thresholds, dtype_class


def to_numpy(value: Any) -> tuple[np.ndarray, str]:
    """(numpy array, original dtype name) for a numpy array or torch tensor.

    torch is never imported here: a tensor is recognised by its type's module, detached,
    moved to the CPU, and widened to float32 when numpy has no such dtype (bf16, fp8).
    """
    if isinstance(value, np.ndarray):
        return value, value.dtype.name
    if type(value).__module__.split(".")[0] == "torch":
        tensor = value.detach().cpu()
        name = str(tensor.dtype).removeprefix("torch.")
        if name == "bfloat16" or name.startswith("float8"):
            tensor = tensor.float()
        return tensor.numpy(), name
    array = np.asarray(value)
    return array, array.dtype.name


def compare_arrays(
    golden: Any,
    target: Any,
    *,
    logits: bool = False,
    vocab_axis: int = -1,
    rel_floor: float | None = None,
    topk: int | None = None,
    chunk_elems: int = 1 << 22,
) -> dict[str, float]:
    """All metrics of an in-memory pair (numpy arrays or torch tensors of the same shape).

    ``rel_floor``/``topk`` default to the packaged thresholds for the pair's dtype class.
    A shape mismatch raises :class:`LayerwatchError` (``compare_pair`` turns it into an
    ERROR verdict).
    """
    g, g_dtype = to_numpy(golden)
    t, t_dtype = to_numpy(target)
    if g.shape != t.shape:
        raise LayerwatchError(f"shape mismatch: golden {list(g.shape)} vs target {list(t.shape)}")
    defaults = Thresholds.default()
    floor = defaults.floor(g_dtype, t_dtype) if rel_floor is None else rel_floor
    exact = dtype_class(g_dtype) == dtype_class(t_dtype) == "int"
    gf, tf = np.ravel(g), np.ravel(t)
    if not logits and g.dtype.kind == t.dtype.kind == "f" and 0 < gf.size <= SMALL:
        return small_metrics([(gf, tf)], floor)[0]  # what compare_pair does for small pairs
    acc = MetricAccumulator(floor, exact=exact)
    fused.kernel_for(gf.size)  # a big pair loads the compiled kernel (numerics/fused.py)
    for start in range(0, gf.size, chunk_elems):
        acc.update(gf[start : start + chunk_elems], tf[start : start + chunk_elems])
    out = acc.result()
    if logits and g.ndim:
        out.update(logits_metrics(g, t, vocab_axis=vocab_axis, k=topk or defaults.topk))
    return out
