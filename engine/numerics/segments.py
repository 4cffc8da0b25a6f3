"""Metrics of many small pairs at once: one concatenation, segment reductions, same results.

A small pair (≤ :data:`SMALL` elements) costs ~0.1 ms of Python and numpy call overhead in the
streaming accumulator — more than its arithmetic. Here a batch of small pairs is concatenated
into two float64 arrays and every sum and maximum is a segment reduction (``np.add.reduceat``,
``np.maximum.reduceat``), so the overhead is paid once per batch.

Every small pair is measured by this code, alone or in a batch: a segment's reduction depends
only on that segment's values (``reduceat`` reduces each segment on its own), so a pair's
metrics are bit-identical whichever batch it lands in (``tests/engine/numerics/test_segments.py``
holds that). Definitions are those of :mod:`.metrics` (float64 accumulation, finite positions
only, NaN/Inf counted and their positions compared); g·t is its own product here.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from layerwatch.engine.numerics import fused
from layerwatch.engine.numerics.metrics import MetricAccumulator, metric_values
from layerwatch.engine.records import Stats, plain_stats

SMALL = 1 << 15
"""Pairs with at most this many elements are measured here (break-even with the streaming
accumulator's per-call overhead is ~3·10⁴ elements)."""
KERNEL_FROM = 1 << 12
"""Smallest pair the compiled kernel measures here once it is loaded. Measured per pair: the
kernel ~25 µs + ~1 ns per element (Python and ctypes), a segment batch ~12 µs + ~5 ns: equal
near 3·10³ elements (bench case (b), 904 pairs of ~900: 16.5 ms here, 25.6 ms by the kernel)."""
BATCH = 1 << 17
"""Elements per batch: the float64 work arrays (1 MiB each, three of them) stay in a core's L2
cache through the ~20 passes of :func:`_segment_sums`. Bench case (b)'s 904 pairs (830 k
elements) measured 15.6 ms in batches of 2¹⁹, 6.2 ms of 2¹⁷, 6.8 ms of 2¹⁵, 10.7 ms of 2¹²
(per-batch call overhead); results do not depend on the batch (module docstring)."""


def small_metrics(
    pairs: Sequence[tuple[np.ndarray, np.ndarray]], rel_floor: float
) -> list[dict[str, float]]:
    """Metrics of each (golden, target) pair of equal-length 1-D float arrays.

    The caller bounds the batch (:data:`BATCH` elements in all is a good size).
    """
    return [acc.result() for acc in small_accumulators(pairs, rel_floor)]


def small_accumulators(
    pairs: Sequence[tuple[np.ndarray, np.ndarray]], rel_floor: float, *, side_stats: bool = False
) -> list[MetricAccumulator]:
    """One filled accumulator per pair (``result()``, ``side_stats()``). A process that has the
    compiled kernel loaded (:mod:`.fused`) measures pairs of :data:`KERNEL_FROM` elements or
    more with it, one call each; smaller ones stay here (which one depends only on the size)."""
    accs = [MetricAccumulator(rel_floor, side_stats=side_stats) for _ in pairs]
    kernel = fused.loaded()
    live = []
    for i, (g, t) in enumerate(pairs):
        if kernel and g.size >= KERNEL_FROM:
            accs[i].update(g, t)
        elif g.size:
            live.append(i)
    for i in live:
        g, t = pairs[i]
        if g.size != t.size:
            raise ValueError(f"chunk sizes differ: {g.size} vs {t.size}")
        accs[i].n = g.size
    if live:
        redo = _fill(accs, live, [pairs[i][0] for i in live], [pairs[i][1] for i in live])
        for i in redo:  # a NaN/Inf (or a float64 overflow) inside: count, then the finite part
            acc = accs[i] = MetricAccumulator(rel_floor, side_stats=side_stats)
            g, t = pairs[i]
            acc.n = g.size
            both = acc.count_nonfinite(g, t)
            if both.any():
                _fill([acc], [0], [g[both]], [t[both]], checked=True)
    return accs


def small_results(
    pairs: Sequence[tuple[np.ndarray, np.ndarray]], rel_floor: float, *, side_stats: bool = False
) -> list[tuple[dict[str, float], tuple[Stats, Stats] | None]]:
    """Per pair, what :func:`small_accumulators`' accumulator gives (``result()``, and
    ``side_stats()`` when asked): the same values, but a batch's clean segments (every value
    finite) go from the segment sums to their metrics without an accumulator a pair (its
    construction, fields and folding were a fifth of a small pair's compare)."""
    out: list[tuple[dict[str, float], tuple[Stats, Stats] | None] | None] = [None] * len(pairs)
    kernel = fused.loaded()
    live = []
    odd = []  # measured by an accumulator: the kernel's sizes, empty pairs, NaN/Inf inside
    for i, (g, t) in enumerate(pairs):
        if g.size and not (kernel and g.size >= KERNEL_FROM):
            if g.size != t.size:
                raise ValueError(f"chunk sizes differ: {g.size} vs {t.size}")
            live.append(i)
        else:
            odd.append(i)
    if live:
        gs = [pairs[i][0] for i in live]
        ts = [pairs[i][1] for i in live]
        # a row: (n, not finite, the ten sums, then with side_stats six extremes); indexed,
        # not unpacked with a star (a list a pair)
        for at, row in zip(live, _columns(gs, ts, rel_floor, side_stats), strict=True):
            if row[1]:
                odd.append(at)
                continue
            n = row[0]
            metrics = metric_values(n, *row[2:12])
            stats = None
            if side_stats:  # SideStats.add_sums, then stats(), of a clean segment (count n > 0):
                # its sums start at 0.0 (0.0 + -0.0 is 0.0), max/min at ∓inf
                stats = (
                    plain_stats(
                        row[12], row[13], (0.0 + row[14]) / n, math.sqrt(0.0 + row[2]), 0, 0
                    ),
                    plain_stats(
                        row[15], row[16], (0.0 + row[17]) / n, math.sqrt(0.0 + row[3]), 0, 0
                    ),
                )
            out[at] = (metrics, stats)
    if odd:
        odd.sort()
        accs = small_accumulators([pairs[i] for i in odd], rel_floor, side_stats=side_stats)
        for i, acc in zip(odd, accs, strict=True):
            out[i] = (acc.result(), acc.side_stats() if side_stats else None)
    return out  # type: ignore[return-value]  # every slot is set


def _columns(
    gs: list[np.ndarray], ts: list[np.ndarray], floor: float, sides: bool
) -> Iterator[tuple[Any, ...]]:
    """Per segment k: (length, not finite, the :func:`_segment_sums` after it, then with
    ``sides`` the :func:`_segment_extremes`) as Python numbers."""
    lens = np.fromiter((g.size for g in gs), dtype=np.intp, count=len(gs))
    starts = np.zeros(len(gs), dtype=np.intp)
    np.cumsum(lens[:-1], out=starts[1:])
    g = np.concatenate(gs, dtype=np.float64)
    t = np.concatenate(ts, dtype=np.float64)
    with np.errstate(all="ignore"):  # segments with NaN/Inf are redone by the caller
        extremes = _segment_extremes(g, t, starts) if sides else ()
        sums = _segment_sums(g, t, starts, floor)
    return zip(lens.tolist(), *(x.tolist() for x in sums + extremes), strict=True)


def _fill(
    accs: list[MetricAccumulator],
    which: list[int],
    gs: list[np.ndarray],
    ts: list[np.ndarray],
    *,
    checked: bool = False,
) -> list[int]:
    """Set the sums of ``accs[which[k]]`` from segment k; return the indices whose squared norms
    are not finite (their sums are left unset for the caller to redo)."""
    sides = accs[which[0]].sides is not None
    redo = []
    for k, (n, is_bad, *values) in enumerate(_columns(gs, ts, accs[which[0]].rel_floor, sides)):
        if is_bad and not checked:
            redo.append(which[k])
            continue
        acc = accs[which[k]]
        acc.n_finite = n
        (acc.gg, acc.tt, acc.gt, acc.dd, acc.max_abs, acc.sum_abs) = values[:6]
        (acc.max_rel, acc.sum_rel, acc.c1, acc.c5) = values[6:10]
        if acc.sides is not None:  # added: a redone segment may hold one-sided values already
            acc.sides[0].add_sums(values[10], values[11], values[12], acc.gg, n)
            acc.sides[1].add_sums(values[13], values[14], values[15], acc.tt, n)
    return redo


def _segment_extremes(g: np.ndarray, t: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per segment: max, min, sum of ``g``, then of ``t`` (side statistics)."""
    out: tuple[np.ndarray, ...] = ()
    for x in (g, t):
        out += (
            np.maximum.reduceat(x, starts),
            np.minimum.reduceat(x, starts),
            np.add.reduceat(x, starts),
        )
    return out


def _segment_sums(
    g: np.ndarray, t: np.ndarray, starts: np.ndarray, floor: float
) -> tuple[np.ndarray, ...]:
    """Per segment: (not finite, ‖g‖², ‖t‖², g·t, ‖d‖², max|d|, Σ|d|, max rel, Σ rel, #rel<1e-3,
    #rel<5e-3). Overwrites ``g`` and ``t``."""
    sq = g * g
    gg = np.add.reduceat(sq, starts)
    np.multiply(t, t, out=sq)
    tt = np.add.reduceat(sq, starts)
    bad = ~(np.isfinite(gg) & np.isfinite(tt))
    np.multiply(g, t, out=sq)
    gt = np.add.reduceat(sq, starts)
    d = np.subtract(t, g, out=t)
    np.multiply(d, d, out=sq)
    dd = np.add.reduceat(sq, starts)
    np.abs(d, out=d)
    max_abs = np.maximum.reduceat(d, starts)
    sum_abs = np.add.reduceat(d, starts)
    np.abs(g, out=g)
    np.maximum(g, floor, out=g)
    rel = np.divide(d, g, out=g)
    max_rel = np.maximum.reduceat(rel, starts)
    sum_rel = np.add.reduceat(rel, starts)
    below = np.less(rel, 1e-3)
    c1 = np.add.reduceat(below, starts, dtype=np.int64)
    np.less(rel, 5e-3, out=below)
    c5 = np.add.reduceat(below, starts, dtype=np.int64)
    return bad, gg, tt, gt, dd, max_abs, sum_abs, max_rel, sum_rel, c1, c5
