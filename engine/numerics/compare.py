"""Compare one golden/target pair of records: shape check, streamed load, metrics, verdict.

:func:`compare_pair` is a plain top-level function with no global state, so process pools
can pickle it. Everything that can go wrong with the files becomes an ERROR verdict with a
one-line reason; nothing raises out of it for bad input.
"""

from __future__ import annotations

import ctypes
import math
import os
import sys
from collections.abc import Iterator, Sequence

import numpy as np
from layerwatch.capture.cpus import spare_core
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.numerics import fused
from layerwatch.engine.numerics.blas import limit_blas_threads
from layerwatch.engine.numerics.logits import LogitsAccumulator, row_blocks
from layerwatch.engine.numerics.metrics import MetricAccumulator, paired_chunks
from layerwatch.engine.numerics.segments import BATCH, SMALL, small_results
from layerwatch.engine.numerics.statistics import stats_metrics, stats_of, tensor_stats
from layerwatch.engine.readers.load import (
    ChunkDecoder,
    canonical_dtype,
    iter_chunks,
    load_flat_many,
    yields_bf16_bits,
)
from layerwatch.engine.readers.prefetch import PayloadPrefetch, prefetchable
from layerwatch.engine.records import (
    Locator,
    PairResult,
    Stats,
    TensorRecord,
    Verdict,
)

__all__ = [
    "CHUNK",
    "compare_pair",
    "compare_pairs",
    "stats_metrics",  # re-exported: public here before statistics.py held them
    "tensor_measure",
    "tensor_stats",
]
from layerwatch.engine.numerics.thresholds import Thresholds, dtype_class

CHUNK = 1 << 17
"""Elements per read in the metric pass: the read buffers (refilled in place) and the float64
work buffers stay in the cache. 2^17 and 2^18 measured alike, 2^22 (fresh arrays) 10 % slower."""


def _keep_freed_chunks() -> None:
    """Let glibc reuse freed chunk buffers instead of unmapping them (Linux only).

    Every chunk the loader reads is a fresh array; above 128 KiB glibc serves it with mmap and
    returns it to the OS on free, so the next chunk page-faults all its memory again. Measured
    on 468 pairs of 120 k elements: the page faults were ~45 % of the CPU time. Raising the
    mmap threshold (32 MiB) and the trim threshold (128 MiB) keeps at most that much freed
    memory in the process; nothing else changes.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 128 << 20)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):  # musl or another libc: keep its defaults
        pass


_keep_freed_chunks()
limit_blas_threads()  # the engine parallelises by process; spinning BLAS threads only compete


def compare_pair(
    golden: TensorRecord,
    target: TensorRecord,
    thresholds: Thresholds,
    *,
    is_logits: bool = False,
    chunk_elems: int = CHUNK,
    side_stats: bool = False,
) -> PairResult:
    """Metrics and verdict for one pair. ``block``/``order`` are left for the session.

    ``side_stats=True``: a side whose record carries no statistics gets them from the same pass
    (``PairResult.golden_stats``/``target_stats``).
    """
    return compare_pairs(
        [(golden, target, is_logits)], thresholds, chunk_elems=chunk_elems, side_stats=side_stats
    )[0]


def compare_pairs(
    items: Sequence[tuple[TensorRecord, TensorRecord, bool]],
    thresholds: Thresholds,
    *,
    chunk_elems: int = CHUNK,
    side_stats: bool = False,
) -> list[PairResult]:
    """:func:`compare_pair` of each ``(golden, target, is_logits)``, in order.

    Small float pairs (≤ :data:`~.segments.SMALL` elements, not logits) are measured together,
    a batch at a time (:mod:`.segments`); their metrics are the same as one at a time.
    """
    results: list[PairResult | None] = [None] * len(items)
    elems = sum(math.prod(g.shape) for g, _, _ in items if g.loc is not None)
    fused.kernel_for(elems)  # one big batch; a run's windows are counted by its JobRunner
    small: dict[tuple[float, bool], list[int]] = {}
    large: list[int] = []
    for i, (golden, target, is_logits) in enumerate(items):
        floor = _small_floor(golden, target, is_logits, thresholds)
        if floor is None:
            large.append(i)
        else:
            wanted = side_stats and (golden.stats is None or target.stats is None)
            small.setdefault((floor, wanted), []).append(i)
    prefetch = _prefetch([items[i] for i in large], chunk_elems)
    try:
        for i in large:
            golden, target, is_logits = items[i]
            wanted = side_stats and (golden.stats is None or target.stats is None)
            results[i] = _compare_one(
                golden, target, thresholds, is_logits, chunk_elems, wanted, prefetch
            )
    finally:
        if prefetch is not None:
            prefetch.close()
    for (floor, wanted), indices in small.items():
        batch: list[int] = []
        held = 0
        for i in indices:
            size = math.prod(items[i][0].shape)
            if batch and held + size > BATCH:
                _compare_small(items, batch, floor, thresholds, results, wanted)
                batch, held = [], 0
            batch.append(i)
            held += size
        _compare_small(items, batch, floor, thresholds, results, wanted)
    return [r for r in results if r is not None]


PREFETCH_FROM = 8 << 20
"""Payload bytes of the streamed pairs of one call from which they are read ahead in a thread
(``readers/prefetch.py``): below that the thread's start and hand-offs cost more than the
overlap of reading with measuring saves."""


def _prefetch(
    items: Sequence[tuple[TensorRecord, TensorRecord, bool]], chunk_elems: int
) -> PayloadPrefetch | None:
    """A reader thread for the streamed pairs' payloads, when there are enough bytes and a
    spare core for it. ``LAYERWATCH_PREFETCH=0``: never, ``=1``: whatever the load (the bench
    times both side by side)."""
    pairs = [
        (g.loc, t.loc)
        for g, t, _ in items
        if g.loc is not None
        and t.loc is not None
        and tuple(g.shape) == tuple(t.shape)
        and prefetchable(g.loc, t.loc)
    ]
    if sum(g.nbytes + t.nbytes for g, t in pairs) < PREFETCH_FROM:
        return None
    knob = os.environ.get("LAYERWATCH_PREFETCH", "")
    if knob == "0" or (knob != "1" and not spare_core()):
        return None
    try:
        return PayloadPrefetch(pairs, chunk_elems)
    except (MemoryError, RuntimeError):  # no room for the ring, no thread: read them here
        return None


def _keep_stats(result: PairResult, stats: tuple[Stats, Stats] | None) -> None:
    """Side statistics for the sides whose records carry none."""
    if stats is not None and result.golden is not None and result.target is not None:
        if result.golden.stats is None:
            result.golden_stats = stats[0]
        if result.target.stats is None:
            result.target_stats = stats[1]


def _new_result(golden: TensorRecord, target: TensorRecord, is_logits: bool) -> PairResult:
    # positional, every field up to is_logits (keywords cost ~0.5 µs more a pair):
    # key, verdict, metrics, failed, reason, golden, target, order, node_type, block, is_logits
    return PairResult(
        golden.key,
        Verdict.ERROR,
        {},
        (),
        "",
        golden,
        target,
        -1,
        golden.node_type or target.node_type,
        -1,
        is_logits,
    )


def _failure(golden: TensorRecord, exc: Exception) -> str:
    """The one-line reason of a pair that could not be compared."""
    if isinstance(exc, LayerwatchError):
        return str(exc)
    where = golden.source or (golden.loc.path if golden.loc else golden.key.node)
    return f"cannot compare {where}: {exc}".splitlines()[0]


def _judged(result: PairResult, metrics: dict[str, float], thresholds: Thresholds) -> PairResult:
    golden, target = result.golden, result.target
    assert golden is not None and target is not None
    verdict, failed, reason = thresholds.judge(
        metrics,
        node=golden.key.node,
        golden_dtype=golden.dtype,
        target_dtype=target.dtype,
        is_logits=result.is_logits,
        stem=golden.key.stem,
    )
    result.verdict, result.metrics, result.failed, result.reason = verdict, metrics, failed, reason
    return result


def _compare_one(
    golden: TensorRecord,
    target: TensorRecord,
    thresholds: Thresholds,
    is_logits: bool,
    chunk_elems: int,
    side_stats: bool = False,
    prefetch: PayloadPrefetch | None = None,
) -> PairResult:
    result = _new_result(golden, target, is_logits)
    if tuple(golden.shape) != tuple(target.shape):
        result.reason = (
            f"shape mismatch: golden {list(golden.shape)} vs target {list(target.shape)}"
        )
        return result
    try:
        if golden.loc is not None and target.loc is not None:
            metrics, stats = tensor_measure(
                golden.loc,
                target.loc,
                floor=thresholds.floor(golden.dtype, target.dtype),
                exact=dtype_class(golden.dtype) == dtype_class(target.dtype) == "int",
                logits=is_logits,
                topk=thresholds.topk,
                chunk_elems=chunk_elems,
                side_stats=side_stats,
                mask=mask_fill(golden, target),
                prefetch=prefetch,
            )
        else:
            stats = (
                stats_of(golden, "golden", chunk_elems),
                stats_of(target, "target", chunk_elems),
            )
            metrics = stats_metrics(
                *stats,
                numel=math.prod(golden.shape),
                floor=thresholds.floor(golden.dtype, target.dtype),
            )
            stats = stats if side_stats else None
    except (LayerwatchError, OSError, ValueError, MemoryError) as exc:
        result.reason = _failure(golden, exc)
        return result
    _keep_stats(result, stats)
    return _judged(result, metrics, thresholds)


_FLOATS = frozenset(("float32", "float16", "bfloat16", "float64", "float8_e4m3fn", "float8_e5m2"))
_LOWEST = {
    "float64": float(np.finfo(np.float64).min),
    "float32": float(np.finfo(np.float32).min),
    "float16": float(np.finfo(np.float16).min),
    "bfloat16": -3.3895313892515355e38,
}
"""The lowest finite value of each float dtype: what frameworks fill additive attention masks
with (``torch.finfo(dtype).min``)."""


def mask_fill(golden: TensorRecord, target: TensorRecord) -> tuple[float, float] | None:
    """(golden, target) lowest values when both tensors reach their own dtype's lowest value
    and the two differ: an additive mask filled with ``finfo(dtype).min`` on each side. Such
    positions are the same "masked" value, not a number to compare (fp32's −3.4e38 against
    fp16's −65504 is a relative error of 1); :func:`unmask` turns them into −inf on both
    sides. Decided from the records' statistics, so it costs nothing when there is no mask;
    dumps without statistics (msit ``.pth``) are compared as numbers."""
    gs, ts = golden.stats, target.stats
    if gs is None or ts is None or golden.loc is None or target.loc is None:
        return None
    try:
        lo_g = _LOWEST.get(canonical_dtype(golden.loc.dtype))
        lo_t = _LOWEST.get(canonical_dtype(target.loc.dtype))
    except LayerwatchError:
        return None
    if lo_g is None or lo_t is None or lo_g == lo_t or gs.min != lo_g or ts.min != lo_t:
        return None
    return lo_g, lo_t


def unmask(
    g: np.ndarray, t: np.ndarray, fill: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray]:
    """Positions holding each side's mask fill on both sides become −inf on both (copies)."""
    both = (g == np.asarray(fill[0], g.dtype)) & (t == np.asarray(fill[1], t.dtype))
    if not both.any():
        return g, t
    g = g.astype(np.float64 if g.dtype == np.float64 else np.float32, copy=True)
    t = t.astype(np.float64 if t.dtype == np.float64 else np.float32, copy=True)
    g[both] = -np.inf
    t[both] = -np.inf
    return g, t


def _small_floor(
    golden: TensorRecord, target: TensorRecord, is_logits: bool, thresholds: Thresholds
) -> float | None:
    """The relative-error floor of a pair the segment kernel measures, else ``None``."""
    g, t = golden.loc, target.loc
    if is_logits or g is None or t is None or tuple(golden.shape) != tuple(target.shape):
        return None
    if not 0 < math.prod(golden.shape) <= SMALL:
        return None
    try:
        if canonical_dtype(g.dtype) not in _FLOATS or canonical_dtype(t.dtype) not in _FLOATS:
            return None
    except LayerwatchError:
        return None  # the regular path reports the unknown dtype
    return thresholds.floor(golden.dtype, target.dtype)


def _compare_small(
    items: Sequence[tuple[TensorRecord, TensorRecord, bool]],
    batch: list[int],
    floor: float,
    thresholds: Thresholds,
    results: list[PairResult | None],
    side_stats: bool,
) -> None:
    arrays: list[tuple[np.ndarray, np.ndarray]] = []
    loaded: list[PairResult] = []
    # every payload of the batch read first, a file's at once (load_flat_many)
    gs = load_flat_many([items[i][0].loc for i in batch])  # type: ignore[misc]  # small: located
    ts = load_flat_many([items[i][1].loc for i in batch])  # type: ignore[misc]
    for i, g, t in zip(batch, gs, ts, strict=True):
        golden, target, is_logits = items[i]
        result = results[i] = _new_result(golden, target, is_logits)
        try:
            if isinstance(g, Exception):
                raise g
            if isinstance(t, Exception):
                raise t
            if g.size != t.size:
                raise ValueError("golden and target streams have different lengths")
            if golden.stats is not None and target.stats is not None:  # mask_fill's first test
                fill = mask_fill(golden, target)
                if fill is not None:
                    g, t = unmask(g, t, fill)
        except (LayerwatchError, OSError, ValueError, MemoryError) as exc:
            result.reason = _failure(golden, exc)
            continue
        arrays.append((g, t))
        loaded.append(result)
    for result, (metrics, stats) in zip(
        loaded, small_results(arrays, floor, side_stats=side_stats), strict=True
    ):
        _keep_stats(result, stats)
        _judged(result, metrics, thresholds)


def tensor_measure(
    golden: Locator,
    target: Locator,
    *,
    floor: float,
    exact: bool = False,
    logits: bool = False,
    topk: int = 5,
    chunk_elems: int = CHUNK,
    side_stats: bool = False,
    mask: tuple[float, float] | None = None,
    prefetch: PayloadPrefetch | None = None,
) -> tuple[dict[str, float], tuple[Stats, Stats] | None]:
    """Stream both tensors once, chunk by chunk, into the metric (and logits) accumulators: the
    metrics and, with ``side_stats``, both sides' statistics (same pass); ``mask``: each side's
    additive-mask fill (:func:`mask_fill`), compared as −inf; ``prefetch``: a reader thread
    that may have this pair's chunks read already (:func:`_prefetch`)."""
    acc = MetricAccumulator(floor, exact=exact, side_stats=side_stats)
    vocab = int(golden.shape[-1]) if golden.shape else 0
    fused.kernel_for(math.prod(golden.shape))
    if mask is None and not (logits and vocab) and fused.loaded():
        # the kernel decodes bf16 on the fly: no float32 copy of the chunk
        bits = (yields_bf16_bits(golden), yields_bf16_bits(target))
        for g, t in _chunk_pairs(golden, target, chunk_elems, bits, prefetch):
            acc.update(g, t, bf16=bits)
        return acc.result(), acc.side_stats() if side_stats else None
    pairs = _chunk_pairs(golden, target, chunk_elems, (False, False), prefetch)
    if mask is not None:
        pairs = (unmask(g, t, mask) for g, t in pairs)
    if not (logits and vocab):
        for g, t in pairs:
            acc.update(g, t)
        return acc.result(), acc.side_stats() if side_stats else None
    lacc = LogitsAccumulator(vocab, topk)
    for g_rows, t_rows in row_blocks(_fed(acc, pairs), vocab):
        lacc.update(g_rows, t_rows)
    return acc.result() | lacc.result(), acc.side_stats() if side_stats else None


def _chunk_pairs(
    golden: Locator,
    target: Locator,
    chunk_elems: int,
    bits: tuple[bool, bool],
    prefetch: PayloadPrefetch | None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Equal-length chunk pairs of both payloads as ``iter_chunks(..., reuse=True,
    bf16_bits=...)`` yields them: from the reader thread when it holds this pair, else read
    here."""
    ahead = prefetch.take(golden, target) if prefetch is not None else None
    if ahead is None:
        return paired_chunks(
            iter_chunks(golden, chunk_elems, reuse=True, bf16_bits=bits[0]),
            iter_chunks(target, chunk_elems, reuse=True, bf16_bits=bits[1]),
        )
    size = min(math.prod(golden.shape), chunk_elems)
    dg = ChunkDecoder(canonical_dtype(golden.dtype), size, bf16_bits=bits[0])
    dt = ChunkDecoder(canonical_dtype(target.dtype), size, bf16_bits=bits[1])
    return ((dg(g), dt(t)) for g, t in ahead)


def _fed(
    acc: MetricAccumulator, pairs: Iterator[tuple[np.ndarray, np.ndarray]]
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for g, t in pairs:
        acc.update(g, t)
        yield g, t
