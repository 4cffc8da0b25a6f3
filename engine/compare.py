"""Compare one golden/target pair of records: shape check, streamed load, metrics, verdict.

:func:`compare_pair` is a plain top-level function with no global state, so process pools
can pickle it. Everything that can go wrong with the files becomes an ERROR verdict with a
one-line reason; nothing raises out of it for bad input.
"""

from __future__ import annotations

import ctypes
import math
import sys
from collections.abc import Iterator, Sequence

import numpy as np
from layerwatch.capture.errors import LayerwatchError

from .load import canonical_dtype, iter_chunks, load_flat
from .logits import LogitsAccumulator, row_blocks
from .metrics import MetricAccumulator, paired_chunks
from .records import (
    INF_GOLDEN,
    INF_TARGET,
    NAN_GOLDEN,
    NAN_MISMATCH,
    NAN_TARGET,
    Locator,
    PairResult,
    Stats,
    TensorRecord,
    Verdict,
)
from .segments import BATCH, SMALL, small_metrics
from .thresholds import Thresholds, dtype_class

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


def compare_pair(
    golden: TensorRecord,
    target: TensorRecord,
    thresholds: Thresholds,
    *,
    is_logits: bool = False,
    chunk_elems: int = CHUNK,
) -> PairResult:
    """Metrics and verdict for one pair. ``block``/``order`` are left for the session."""
    return compare_pairs([(golden, target, is_logits)], thresholds, chunk_elems=chunk_elems)[0]


def compare_pairs(
    items: Sequence[tuple[TensorRecord, TensorRecord, bool]],
    thresholds: Thresholds,
    *,
    chunk_elems: int = CHUNK,
) -> list[PairResult]:
    """:func:`compare_pair` of each ``(golden, target, is_logits)``, in order.

    Small float pairs (≤ :data:`~.segments.SMALL` elements, not logits) are measured together,
    a batch at a time (:mod:`.segments`); their metrics are the same as one at a time.
    """
    results: list[PairResult | None] = [None] * len(items)
    small: dict[float, list[int]] = {}
    for i, (golden, target, is_logits) in enumerate(items):
        floor = _small_floor(golden, target, is_logits, thresholds)
        if floor is None:
            results[i] = _compare_one(golden, target, thresholds, is_logits, chunk_elems)
        else:
            small.setdefault(floor, []).append(i)
    for floor, indices in small.items():
        batch: list[int] = []
        held = 0
        for i in indices:
            size = math.prod(items[i][0].shape)
            if batch and held + size > BATCH:
                _compare_small(items, batch, floor, thresholds, results)
                batch, held = [], 0
            batch.append(i)
            held += size
        _compare_small(items, batch, floor, thresholds, results)
    return [r for r in results if r is not None]


def _new_result(golden: TensorRecord, target: TensorRecord, is_logits: bool) -> PairResult:
    return PairResult(
        key=golden.key,
        verdict=Verdict.ERROR,
        golden=golden,
        target=target,
        node_type=golden.node_type or target.node_type,
        is_logits=is_logits,
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
) -> PairResult:
    result = _new_result(golden, target, is_logits)
    if tuple(golden.shape) != tuple(target.shape):
        result.reason = (
            f"shape mismatch: golden {list(golden.shape)} vs target {list(target.shape)}"
        )
        return result
    try:
        if golden.loc is not None and target.loc is not None:
            metrics = tensor_metrics(
                golden.loc,
                target.loc,
                floor=thresholds.floor(golden.dtype, target.dtype),
                exact=dtype_class(golden.dtype) == dtype_class(target.dtype) == "int",
                logits=is_logits,
                topk=thresholds.topk,
                chunk_elems=chunk_elems,
            )
        else:
            metrics = stats_metrics(
                _stats_of(golden, "golden", chunk_elems),
                _stats_of(target, "target", chunk_elems),
                numel=math.prod(golden.shape),
                floor=thresholds.floor(golden.dtype, target.dtype),
            )
    except (LayerwatchError, OSError, ValueError, MemoryError) as exc:
        result.reason = _failure(golden, exc)
        return result
    return _judged(result, metrics, thresholds)


_FLOATS = frozenset(("float32", "float16", "bfloat16", "float64", "float8_e4m3fn", "float8_e5m2"))


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
) -> None:
    arrays: list[tuple[np.ndarray, np.ndarray]] = []
    loaded: list[PairResult] = []
    for i in batch:
        golden, target, is_logits = items[i]
        result = results[i] = _new_result(golden, target, is_logits)
        assert golden.loc is not None and target.loc is not None
        try:
            g, t = load_flat(golden.loc), load_flat(target.loc)
            if g.size != t.size:
                raise ValueError("golden and target streams have different lengths")
        except (LayerwatchError, OSError, ValueError, MemoryError) as exc:
            result.reason = _failure(golden, exc)
            continue
        arrays.append((g, t))
        loaded.append(result)
    for result, metrics in zip(loaded, small_metrics(arrays, floor), strict=True):
        _judged(result, metrics, thresholds)


def tensor_metrics(
    golden: Locator,
    target: Locator,
    *,
    floor: float,
    exact: bool = False,
    logits: bool = False,
    topk: int = 5,
    chunk_elems: int = CHUNK,
) -> dict[str, float]:
    """Stream both tensors once, chunk by chunk, into the metric (and logits) accumulators."""
    acc = MetricAccumulator(floor, exact=exact)
    pairs = paired_chunks(
        iter_chunks(golden, chunk_elems, reuse=True), iter_chunks(target, chunk_elems, reuse=True)
    )
    vocab = int(golden.shape[-1]) if golden.shape else 0
    if not (logits and vocab):
        for g, t in pairs:
            acc.update(g, t)
        return acc.result()
    lacc = LogitsAccumulator(vocab, topk)
    for g_rows, t_rows in row_blocks(_fed(acc, pairs), vocab):
        lacc.update(g_rows, t_rows)
    return acc.result() | lacc.result()


def _fed(
    acc: MetricAccumulator, pairs: Iterator[tuple[np.ndarray, np.ndarray]]
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for g, t in pairs:
        acc.update(g, t)
        yield g, t


# -- statistics ------------------------------------------------------------------------------
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


def _stats_of(record: TensorRecord, side: str, chunk_elems: int) -> Stats:
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
