"""Per-pair metrics in one streaming float64 pass, in bounded memory.

:class:`MetricAccumulator` is fed golden/target chunks in C order and keeps only scalar
float64 sums, so a multi-GB pair compares in the memory of one chunk. Every chunk is cut
into cache-sized blocks; a block costs one float64 copy of each side, three BLAS dot
products (‖g‖², ‖t‖², ‖t−g‖²; g·t is a fourth only in blocks whose vectors are not close)
and a handful of in-place ufuncs. Chunks whose bytes are identical (deterministic re-runs)
skip all float work except ‖g‖².

Definitions (over positions where *both* sides are finite, ``n_f`` of them):

* cosine = 1 − (‖d‖² − (‖g‖ − ‖t‖)²) / (2‖g‖‖t‖), d = t − g, for close vectors
  (‖d‖² ≤ ‖g‖‖t‖): computed from the difference norm, 1 − cos keeps its digits near 1
  (0.9999 vs 0.99999 resolve; nothing is rounded). Otherwise g·t / (‖g‖‖t‖), which is exact
  to ~1e-16 there (and stays right when the norms are orders of magnitude apart).
  Both norms 0 → 1.0; exactly one norm 0 → 0.0.
* relative_euclidean_distance = ‖d‖ / ‖g‖; ‖g‖ = 0 → ``inf`` if ‖d‖ > 0 else 0.
* norm_relative_error = |‖t‖ − ‖g‖| / ‖g‖ (same zero rule): the scale part of the error.
* absolute errors |d|; relative errors |d| / max(|g|, floor), where ``floor`` is the
  small-value floor of the dtype class (``[floor]`` in thresholds.toml). Nothing is masked:
  golden 0 vs target 1 gives 1/floor, not 0 (msit's bug).
* one/five-thousandth ratios: share of positions with relative error < 1e-3 / 5e-3.
* NaN/Inf are counted per side; ``nonfinite_mismatch`` = positions whose class (finite, NaN,
  +Inf, −Inf) differs between the sides.
* integer/bool pairs additionally report ``exact_match_ratio`` (share of equal elements,
  compared in the original integer values); their other metrics use the values cast to
  float64.
* no finite position at all (empty, all NaN on both sides) → vacuously perfect metrics.

KL divergence and the other logits metrics live in :mod:`.logits`.

Two engines fill the same sums: the numpy block path below, and the compiled single pass of
:mod:`.fused` once a process has loaded it (large compares). Both keep the definitions above;
they agree to float64 rounding of the sums (``tests/engine/numerics/test_fused.py``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Iterator

import numpy as np
from layerwatch.engine.numerics import fused
from layerwatch.engine.numerics.statistics import SideStats
from layerwatch.engine.records import (
    COSINE,
    EXACT,
    FIVE_THOUSANDTHS,
    INF_GOLDEN,
    INF_TARGET,
    MAX_ABS,
    MAX_REL,
    MEAN_ABS,
    MEAN_REL,
    NAN_GOLDEN,
    NAN_MISMATCH,
    NAN_TARGET,
    NORM_REL,
    ONE_THOUSANDTH,
    RED,
    Stats,
)

BLOCK = 1 << 17
"""Elements per compute block. Measured (AMD EPYC, 512 KiB L2, 32 MiB L3): 2^15 costs 4.4 ns
per element pair, 2^17 3.4-3.6 (the ~20 numpy calls per block cost ~1 us each), 2^20 4.3+
(the buffers no longer stay in the cache)."""


class MetricAccumulator:
    """Streaming float64 accumulator for one golden/target pair.

    Feed equal-length 1-D chunks with :meth:`update` (any float/int/bool dtype; bf16 arrives
    as float32 from the loader), then read :meth:`result`. Chunk boundaries never change the
    result beyond float64 rounding of the sums.
    """

    def __init__(
        self,
        rel_floor: float,
        *,
        exact: bool = False,
        block: int = BLOCK,
        side_stats: bool = False,
    ) -> None:
        self.rel_floor = float(rel_floor)
        """Small-value floor of the relative error (absolute, in the tensor's units)."""
        self.exact = exact
        """Count exactly-equal elements (integer/bool pairs)."""
        self.sides = (SideStats(), SideStats()) if side_stats else None
        """Golden and target statistics (:meth:`side_stats`), gathered only when asked for:
        four more reductions per block (~+25 % on large pairs)."""
        self._block = block
        self.n = 0
        self.n_finite = 0
        self.equal = 0
        self.nan_g = self.nan_t = self.inf_g = self.inf_t = self.mismatch = 0
        self.gg = self.tt = self.gt = self.dd = 0.0
        self.max_abs = self.sum_abs = self.max_rel = self.sum_rel = 0.0
        self.c1 = self.c5 = 0
        self._totals: fused.Totals | None = None
        """The compiled kernel's running sums, folded into the fields above by :meth:`_fold`."""

    # -- feeding -------------------------------------------------------------------------
    def update(
        self, golden: np.ndarray, target: np.ndarray, *, bf16: tuple[bool, bool] = (False, False)
    ) -> None:
        """``bf16``: that side is a uint16 array of bfloat16 bits (the reader's raw chunk), decoded
        on the fly by the kernel, or here when the numpy path measures it."""
        g = np.ravel(golden)
        t = np.ravel(target)
        if g.dtype.kind == "c" or t.dtype.kind == "c":  # compare (re, im) as a real vector
            g = np.ravel(g.astype(np.complex128).view(np.float64))
            t = np.ravel(t.astype(np.complex128).view(np.float64))
        if g.size != t.size:
            raise ValueError(f"chunk sizes differ: {g.size} vs {t.size}")
        if g.size == 0:
            return
        self.n += g.size
        kernel = fused.kernel_for(g.size)
        same = _same_bytes(g, t) and bf16[0] == bf16[1]
        if kernel is not None and not same:
            if self._totals is None:
                self._totals = fused.new_totals()
            kinds = (
                fused.KIND_BF16 if bf16[0] else fused.KIND_PLAIN,
                fused.KIND_BF16 if bf16[1] else fused.KIND_PLAIN,
            )
            if fused.measure(
                kernel,
                g,
                t,
                self._totals,
                kinds=kinds,
                floor=self.rel_floor,
                exact=self.exact,
                sides=self.sides is not None,
            ):
                return
        g = fused.decode_bf16(g) if bf16[0] else g
        t = fused.decode_bf16(t) if bf16[1] else t
        self._g, self._t, self._d, self._b = _scratch(self._block)
        if same:
            self._identical(g)
            return
        if self.exact:
            self.equal += int(np.count_nonzero(g == t))
        step = self._block
        for start in range(0, g.size, step):
            self._float_block(g[start : start + step], t[start : start + step], checked=False)

    def _identical(self, g: np.ndarray) -> None:
        """Byte-identical chunk: no error terms, only ‖g‖² and the NaN/Inf counts."""
        step = self._block
        gg = 0.0
        for start in range(0, g.size, step):
            part = g[start : start + step]
            buf = self._g[: part.size]
            np.copyto(buf, part, casting="unsafe")
            gg += float(buf @ buf)
        finite = g.size
        values = g
        if not math.isfinite(gg) and g.dtype.kind in "fc":
            fin = np.isfinite(g)
            finite = int(np.count_nonzero(fin))
            nan = int(np.count_nonzero(np.isnan(g)))
            self.nan_g += nan
            self.nan_t += nan
            self.inf_g += g.size - finite - nan
            self.inf_t += g.size - finite - nan
            masked = np.where(fin, g, 0).astype(np.float64)
            gg = float(masked @ masked)
            values = g[fin]
        if self.sides is not None:
            wide = values.astype(np.float64, copy=False)
            for side in self.sides:
                side.add(wide, gg)
        self.gg += gg
        self.tt += gg
        self.gt += gg
        self.n_finite += finite
        self.c1 += finite
        self.c5 += finite
        self.equal += g.size

    def _float_block(self, gb: np.ndarray, tb: np.ndarray, *, checked: bool) -> None:
        m = gb.size
        g, t, d, b = self._g[:m], self._t[:m], self._d[:m], self._b[:m]
        np.copyto(g, gb, casting="unsafe")
        np.copyto(t, tb, casting="unsafe")
        gg = float(g @ g)
        tt = float(t @ t)
        if not checked and not (math.isfinite(gg) and math.isfinite(tt)):
            self._nonfinite_block(gb, tb)
            return
        if self.sides is not None:
            self.sides[0].add(g, gg)
            self.sides[1].add(t, tt)
        np.subtract(t, g, out=d)
        dd = float(d @ d)
        # A close block (‖d‖² ≤ (‖g‖² + ‖t‖²)/4: the norms are within 2.3× of each other) gets g·t
        # from the three squares, exact to a few ε·‖g‖‖t‖ (summed over blocks, to a few ε·‖g‖‖t‖
        # of the whole pair, by Cauchy-Schwarz): one dot product less. Otherwise its own dot.
        gt = 0.5 * (gg + tt - dd) if dd <= 0.25 * (gg + tt) else float(g @ t)
        self.gg += gg
        self.tt += tt
        self.gt += gt
        self.dd += dd
        self.n_finite += m
        np.abs(d, out=d)
        self.max_abs = max(self.max_abs, float(d.max()))
        self.sum_abs += float(d.sum())
        np.abs(g, out=g)
        np.maximum(
            g, _floor_array(self.rel_floor, m), out=g
        )  # array operand: 1.4x a scalar's speed
        np.divide(d, g, out=g)  # g holds the relative error
        self.max_rel = max(self.max_rel, float(g.max()))
        self.sum_rel += float(g.sum())
        np.less(g, 1e-3, out=b)
        self.c1 += int(np.count_nonzero(b))
        np.less(g, 5e-3, out=b)
        self.c5 += int(np.count_nonzero(b))

    def _nonfinite_block(self, gb: np.ndarray, tb: np.ndarray) -> None:
        """Count NaN/Inf per side, compare their positions, then measure the finite rest."""
        both = self.count_nonfinite(gb, tb)
        if both.any():
            self._float_block(gb[both], tb[both], checked=True)

    def count_nonfinite(self, gb: np.ndarray, tb: np.ndarray) -> np.ndarray:
        """Add the NaN/Inf counts and position mismatches of a chunk pair; return the mask of
        the positions finite on both sides."""
        fg = np.isfinite(gb)
        ft = np.isfinite(tb)
        nan_g = np.isnan(gb)
        nan_t = np.isnan(tb)
        self.nan_g += int(np.count_nonzero(nan_g))
        self.nan_t += int(np.count_nonzero(nan_t))
        self.inf_g += gb.size - int(np.count_nonzero(fg)) - int(np.count_nonzero(nan_g))
        self.inf_t += tb.size - int(np.count_nonzero(ft)) - int(np.count_nonzero(nan_t))
        both_bad = ~fg & ~ft
        same_bad = both_bad & ((nan_g & nan_t) | (gb == tb))  # +inf==+inf, -inf==-inf
        self.mismatch += int(np.count_nonzero(fg != ft)) + int(
            np.count_nonzero(both_bad) - np.count_nonzero(same_bad)
        )
        both = fg & ft
        if self.sides is not None:  # finite on one side only: still part of that side's stats
            for side, x, fin in ((self.sides[0], gb, fg), (self.sides[1], tb, ft)):
                alone = x[fin & ~both].astype(np.float64)
                side.add(alone, float(alone @ alone))
        return both

    def _fold(self) -> None:
        """Add the kernel's running sums (if any) to the fields the numpy path fills."""
        if self._totals is None:
            return
        f = self._totals.f.tolist()
        k = self._totals.k.tolist()
        self._totals = None
        self.gg += f[fused.F_GG]
        self.tt += f[fused.F_TT]
        self.gt += f[fused.F_GT]
        self.dd += f[fused.F_DD]
        self.sum_abs += f[fused.F_SUM_ABS]
        self.max_abs = max(self.max_abs, f[fused.F_MAX_ABS])
        self.sum_rel += f[fused.F_SUM_REL]
        self.max_rel = max(self.max_rel, f[fused.F_MAX_REL])
        self.n_finite += k[fused.I_FINITE]
        self.c1 += k[fused.I_C1]
        self.c5 += k[fused.I_C5]
        self.nan_g += k[fused.I_NAN_G]
        self.nan_t += k[fused.I_NAN_T]
        self.inf_g += k[fused.I_INF_G]
        self.inf_t += k[fused.I_INF_T]
        self.mismatch += k[fused.I_MISMATCH]
        self.equal += k[fused.I_EQUAL]
        if self.sides is not None:
            for side, cols, count in (
                (self.sides[0], fused.GOLDEN_SIDE, fused.I_G_COUNT),
                (self.sides[1], fused.TARGET_SIDE, fused.I_T_COUNT),
            ):
                high, low, total, sq = (f[c] for c in cols)
                side.add_sums(high, low, total, sq, k[count])

    def side_stats(self) -> tuple[Stats, Stats]:
        """(golden, target) statistics over each side's finite elements (``side_stats=True``)."""
        self._fold()
        if self.sides is None:
            raise ValueError("side statistics were not gathered (side_stats=False)")
        golden, target = self.sides
        return golden.stats(self.nan_g, self.inf_g), target.stats(self.nan_t, self.inf_t)

    # -- reading -------------------------------------------------------------------------
    def result(self) -> dict[str, float]:
        self._fold()
        out = metric_values(
            self.n_finite,
            self.gg,
            self.tt,
            self.gt,
            self.dd,
            self.max_abs,
            self.sum_abs,
            self.max_rel,
            self.sum_rel,
            self.c1,
            self.c5,
            self.mismatch,
            self.nan_g,
            self.nan_t,
            self.inf_g,
            self.inf_t,
        )
        if self.exact:
            out[EXACT] = self.equal / self.n if self.n else 1.0
        return out


def metric_values(
    nf: int,
    gg: float,
    tt: float,
    gt: float,
    dd: float,
    max_abs: float,
    sum_abs: float,
    max_rel: float,
    sum_rel: float,
    c1: int,
    c5: int,
    mismatch: int = 0,
    nan_g: int = 0,
    nan_t: int = 0,
    inf_g: int = 0,
    inf_t: int = 0,
) -> dict[str, float]:
    """A pair's metrics from its sums over ``nf`` finite positions (:meth:`MetricAccumulator.result`
    for one accumulator, ``segments.small_results`` for a batch without one a pair)."""
    ng, nt = math.sqrt(gg), math.sqrt(tt)
    if ng == 0.0 and nt == 0.0:
        cos = 1.0
    elif ng == 0.0 or nt == 0.0:
        cos = 0.0
    elif dd <= ng * nt:
        # Close vectors: 1 - cos from the difference norm keeps its digits (error ~ε·‖d‖²/‖g‖‖t‖).
        cos = 1.0 - min(max((dd - (ng - nt) ** 2) / (2.0 * ng * nt), 0.0), 2.0)
    else:
        # Far apart (or norms orders of magnitude apart): the plain quotient is exact to ~ε.
        cos = min(max(gt / (ng * nt), -1.0), 1.0)
    nd = math.sqrt(dd)
    red = nd / ng if ng > 0.0 else (math.inf if nd > 0.0 else 0.0)
    norm_rel = abs(nt - ng) / ng if ng > 0.0 else (math.inf if nt > 0.0 else 0.0)
    return {
        COSINE: cos,
        MAX_REL: max_rel,
        MEAN_REL: sum_rel / nf if nf else 0.0,
        MAX_ABS: max_abs,
        MEAN_ABS: sum_abs / nf if nf else 0.0,
        RED: red,
        NORM_REL: norm_rel,
        ONE_THOUSANDTH: c1 / nf if nf else 1.0,
        FIVE_THOUSANDTHS: c5 / nf if nf else 1.0,
        NAN_MISMATCH: float(mismatch),
        NAN_GOLDEN: float(nan_g),
        NAN_TARGET: float(nan_t),
        INF_GOLDEN: float(inf_g),
        INF_TARGET: float(inf_t),
    }


_SCRATCH = threading.local()


def _scratch(size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-thread float64 work buffers, reused across pairs: a fresh buffer per pair is a
    fresh mmap, and its page faults cost as much as the arithmetic on small tensors."""
    bufs = getattr(_SCRATCH, "bufs", None)
    if bufs is None or len(bufs[0]) < size:
        bufs = _SCRATCH.bufs = (
            np.empty(size),
            np.empty(size),
            np.empty(size),
            np.empty(size, dtype=bool),
        )
    return bufs


def _floor_array(value: float, m: int) -> np.ndarray:
    """``m`` copies of a relative-error floor (per thread, cached by value)."""
    cache = getattr(_SCRATCH, "floors", None)
    if cache is None:
        cache = _SCRATCH.floors = {}
    arr = cache.get(value)
    if arr is None or arr.size < m:
        if len(cache) >= 8:
            cache.clear()
        arr = cache[value] = np.full(max(m, BLOCK), value)
    return arr[:m]


def _same_bytes(g: np.ndarray, t: np.ndarray) -> bool:
    """True when both chunks hold the same dtype and byte-identical payloads."""
    if g.dtype != t.dtype or not (g.flags.c_contiguous and t.flags.c_contiguous):
        return False
    view = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(g.dtype.itemsize)
    if view is None:
        return False
    gv, tv = g.view(view), t.view(view)
    head = min(gv.size, 256)  # cheap early exit: differing pairs usually differ at once
    return bool(np.array_equal(gv[:head], tv[:head]) and np.array_equal(gv, tv))


def paired_chunks(
    golden: Iterable[np.ndarray], target: Iterable[np.ndarray]
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Zip two chunk streams of the same total length into equal-length chunk pairs.

    The two readers may cut their streams differently (NZ un-blocking, strided views); this
    re-slices without copying more than the current chunks. A length difference raises.
    """
    it_g, it_t = iter(golden), iter(target)
    g = t = np.empty(0)
    while True:
        if g.size == 0:
            g = _next_nonempty(it_g)
        if t.size == 0:
            t = _next_nonempty(it_t)
        if g.size == 0 or t.size == 0:
            if g.size or t.size:
                raise ValueError("golden and target streams have different lengths")
            return
        m = min(g.size, t.size)
        yield g[:m], t[:m]
        g, t = g[m:], t[m:]


def _next_nonempty(chunks: Iterator[np.ndarray]) -> np.ndarray:
    for chunk in chunks:
        if chunk.size:
            return np.ravel(chunk)
    return np.empty(0)
