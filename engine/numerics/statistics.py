"""Statistics of tensors (max, min, mean, L2 norm over the finite elements; NaN/Inf counted) and
the comparison of two sets of statistics: what statistics-only dumps (msit ``-st``, msprobe
statistics tasks, ATB statistics files) can be compared by."""

from __future__ import annotations

import math

import numpy as np
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.readers.load import iter_chunks
from layerwatch.engine.records import (
    INF_GOLDEN,
    INF_TARGET,
    NAN_GOLDEN,
    NAN_MISMATCH,
    NAN_TARGET,
    Locator,
    Stats,
    TensorRecord,
)


def tensor_stats(loc: Locator, chunk_elems: int = 1 << 22) -> Stats:
    """max/min/mean/L2 norm over the finite elements (float64), NaN/Inf counted; streamed."""
    hi, lo, total, sq, finite, nan, inf = -math.inf, math.inf, 0.0, 0.0, 0, 0, 0
    for chunk in iter_chunks(loc, chunk_elems):
        x = chunk.astype(np.float64)
        if chunk.dtype.kind in "fc":
            fin = np.isfinite(x)
            if not fin.all():
                n_nan = int(np.count_nonzero(np.isnan(x)))
                nan += n_nan
                inf += x.size - int(np.count_nonzero(fin)) - n_nan
                x = x[fin]
        if x.size:
            hi, lo = max(hi, float(x.max())), min(lo, float(x.min()))
            total += float(x.sum())
            sq += float(x @ x)
            finite += x.size
    if not finite:
        return Stats(math.nan, math.nan, math.nan, 0.0, nan, inf)
    return Stats(hi, lo, total / finite, math.sqrt(sq), nan, inf)


def stats_of(record: TensorRecord, side: str, chunk_elems: int) -> Stats:
    if record.stats is not None:
        return record.stats
    if record.loc is not None:
        return tensor_stats(record.loc, chunk_elems)
    raise LayerwatchError(f"{side} {record.key.label()} has neither tensor data nor statistics")


def stats_metrics(golden: Stats, target: Stats, *, numel: int, floor: float) -> dict[str, float]:
    """Errors of the statistics (msit ``-st`` names) and NaN/Inf counts.

    Relative errors of max/min/mean are taken against max(|golden stat|, golden RMS) — the
    RMS (norm/√n) is the tensor's own scale, so a mean that is ≈0 for a centred tensor does
    not explode (msprobe's weakness) — and the L2 norm's against max(‖g‖, floor). The NaN/Inf
    mismatch is a lower bound (positions are unknown): |Δ NaN count| + |Δ Inf count|.
    """
    finite = max(numel - int(golden.nan) - int(golden.inf), 1)
    rms = golden.norm / math.sqrt(finite) if math.isfinite(golden.norm) else math.inf
    out: dict[str, float] = {}
    for name, g, t, scale in (
        ("max", golden.max, target.max, max(rms, floor)),
        ("min", golden.min, target.min, max(rms, floor)),
        ("mean", golden.mean, target.mean, max(rms, floor)),
        ("l2norm", golden.norm, target.norm, floor),
    ):
        diff = _stat_diff(g, t)
        out[f"{name}_stat_relative_error"] = diff / max(abs(g), scale) if math.isfinite(g) else diff
        out[f"{name}_stat_absolute_error"] = diff
    out[NAN_MISMATCH] = float(abs(target.nan - golden.nan) + abs(target.inf - golden.inf))
    out[NAN_GOLDEN], out[NAN_TARGET] = float(golden.nan), float(target.nan)
    out[INF_GOLDEN], out[INF_TARGET] = float(golden.inf), float(target.inf)
    return out


def _stat_diff(g: float, t: float) -> float:
    g_nan, t_nan = math.isnan(g), math.isnan(t)
    if g_nan or t_nan:
        return 0.0 if g_nan and t_nan else math.inf
    if g == t:  # also equal infinities
        return 0.0
    return abs(t - g)
