"""Statistics of tensors (max, min, mean, L2 norm over the finite elements; NaN/Inf counted) and
the comparison of two sets of statistics: what statistics-only dumps (msit ``-st``, msprobe
statistics tasks, ATB statistics files) can be compared by.

One accumulator, :class:`SideStats`, gathers them both for a streamed read of one tensor
(:func:`tensor_stats`) and inside the metric pass (``metrics.MetricAccumulator`` with
``side_stats``), which fills msit's CSV columns ``golden_max_value`` … ``my_mean_value`` for
dumps that record no statistics (msit ``.pth``) without a second read of the tensor."""

from __future__ import annotations

import math

import numpy as np
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.numerics import fused
from layerwatch.engine.readers.load import iter_chunks, yields_bf16_bits
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


class SideStats:
    """Running max/min/Σx/Σx²/count of the finite elements of one side (float64)."""

    __slots__ = ("count", "high", "low", "sq", "total")

    def __init__(self) -> None:
        self.high = -math.inf
        self.low = math.inf
        self.total = 0.0
        self.sq = 0.0
        self.count = 0

    def add(self, values: np.ndarray, sq: float) -> None:
        """Finite float64 ``values`` whose squares sum to ``sq`` (the caller has it already)."""
        if values.size:
            self.high = max(self.high, float(values.max()))
            self.low = min(self.low, float(values.min()))
            self.total += float(values.sum())
            self.sq += sq
            self.count += values.size

    def add_sums(self, high: float, low: float, total: float, sq: float, count: int) -> None:
        if count:
            self.high = max(self.high, high)
            self.low = min(self.low, low)
            self.total += total
            self.sq += sq
            self.count += count

    def stats(self, nan: int, inf: int) -> Stats:
        """NaN for max/min/mean when nothing is finite (there is nothing to take them over)."""
        if not self.count:
            return Stats(math.nan, math.nan, math.nan, 0.0, nan, inf)
        return Stats(self.high, self.low, self.total / self.count, math.sqrt(self.sq), nan, inf)


def tensor_stats(loc: Locator, chunk_elems: int = 1 << 22) -> Stats:
    """max/min/mean/L2 norm over the finite elements (float64), NaN/Inf counted; streamed.
    A big tensor (or any, once the process has it) goes through the compiled metric kernel,
    measured against itself: its golden-side statistics, in one pass."""
    kernel = fused.kernel_for(math.prod(loc.shape))
    if kernel is not None:
        stats = _kernel_stats(kernel, loc, min(chunk_elems, 1 << 17))
        if stats is not None:
            return stats
    side, nan, inf = SideStats(), 0, 0
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
            side.add(x, float(x @ x))
    return side.stats(nan, inf)


def _kernel_stats(kernel: fused.Kernel, loc: Locator, chunk_elems: int) -> Stats | None:
    """``None`` when the dtype is not one the kernel is built for (told by the first chunk)."""
    bits = yields_bf16_bits(loc)
    kind = fused.KIND_BF16 if bits else fused.KIND_PLAIN
    totals = fused.new_totals()
    for chunk in iter_chunks(loc, chunk_elems, reuse=True, bf16_bits=bits):
        if not fused.measure(
            kernel, chunk, chunk, totals, kinds=(kind, kind), floor=1.0, exact=False, sides=True
        ):
            return None
    f, k = totals.f.tolist(), totals.k.tolist()
    side = SideStats()
    high, low, total, sq = (f[c] for c in fused.GOLDEN_SIDE)
    side.add_sums(high, low, total, sq, k[fused.I_G_COUNT])
    return side.stats(k[fused.I_NAN_G], k[fused.I_INF_G])


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
