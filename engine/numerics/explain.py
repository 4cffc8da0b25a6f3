"""The operator view of one pair: both sides' statistics, every metric against its limit, the
inputs, an error histogram, the worst elements, and one sentence saying why it was flagged.

Built on demand (the tensors are read again, streamed, so a large pair stays in bounded
memory); call it off the UI thread.
"""

from __future__ import annotations

import math

import numpy as np
from layerwatch.engine.numerics.compare import tensor_stats
from layerwatch.engine.numerics.metrics import paired_chunks
from layerwatch.engine.numerics.thresholds import Thresholds, fmt_value
from layerwatch.engine.readers.load import iter_chunks
from layerwatch.engine.records import COSINE, MAX_ABS, PairResult, TensorRecord, Verdict
from layerwatch.engine.seam import PairDetail, SideSummary, WorstElement

WORST = 10
"""How many of the largest absolute errors the view lists."""
BINS = 12
"""Log-spaced histogram bins between max_abs·1e-6 and max_abs (plus one bin from 0)."""
HISTOGRAM_LABEL = (
    "|target − golden| per element, log-spaced bins from 0 and 1e-6·max to the max "
    "(positions finite on both sides)"
)


def explain(
    result: PairResult,
    thresholds: Thresholds,
    inputs: list[PairResult],
    *,
    chunk_elems: int = 1 << 20,
) -> PairDetail:
    """Everything the operator view shows for ``result``; ``inputs`` are the node's input pairs
    at the same token (the session passes them)."""
    g, t = result.golden, result.target
    checks = []
    if result.metrics and g is not None and t is not None:
        checks = thresholds.checks(
            result.metrics,
            node=result.key.node,
            golden_dtype=g.dtype,
            target_dtype=t.dtype,
            is_logits=result.is_logits,
            stem=result.key.stem,
        )
    edges: list[float] = []
    counts: list[int] = []
    worst: list[WorstElement] = []
    max_abs = result.metrics.get(MAX_ABS)
    comparable = (
        g is not None
        and t is not None
        and g.loc is not None
        and t.loc is not None
        and tuple(g.shape) == tuple(t.shape)
        and max_abs is not None
        and math.isfinite(max_abs)
    )
    if comparable:
        assert g is not None and t is not None and max_abs is not None
        floor = thresholds.floor(g.dtype, t.dtype)
        edges, counts, worst = _scan(g, t, max_abs, floor, chunk_elems)
    return PairDetail(
        result=result,
        golden=_side(g, chunk_elems),
        target=_side(t, chunk_elems),
        checks=checks,
        inputs=list(inputs),
        histogram_edges=edges,
        histogram_counts=counts,
        histogram_label=HISTOGRAM_LABEL if edges else "",
        worst=worst,
        sentence=sentence(result, inputs),
    )


def _side(record: TensorRecord | None, chunk_elems: int) -> SideSummary | None:
    if record is None:
        return None
    stats = record.stats
    if stats is None and record.loc is not None:
        try:
            stats = tensor_stats(record.loc, chunk_elems)
        except (OSError, ValueError):  # LayerwatchError included: the result already says so
            stats = None
    source = record.source or (record.loc.path if record.loc is not None else "")
    return SideSummary(record.dtype, tuple(record.shape), stats, source)


def _scan(
    g: TensorRecord, t: TensorRecord, max_abs: float, floor: float, chunk_elems: int
) -> tuple[list[float], list[int], list[WorstElement]]:
    """One streamed pass: histogram of |t − g| and the ``WORST`` largest errors."""
    assert g.loc is not None and t.loc is not None
    if max_abs > 0:
        edges = np.concatenate(
            [[0.0], np.logspace(math.log10(max_abs) - 6, math.log10(max_abs), BINS + 1)]
        )
    else:
        edges = np.array([0.0, 0.0])
    counts = np.zeros(len(edges) - 1, dtype=np.int64)
    best_idx = np.empty(0, dtype=np.int64)
    best = np.empty((0, 3))  # err, golden, target
    offset = 0
    try:
        pairs = paired_chunks(iter_chunks(g.loc, chunk_elems), iter_chunks(t.loc, chunk_elems))
        for gc, tc in pairs:
            g64, t64 = gc.astype(np.float64), tc.astype(np.float64)
            with np.errstate(invalid="ignore"):
                err = np.abs(t64 - g64)
            bad = np.isnan(err)
            if bad.any():  # NaN vs NaN and equal infinities match; anything else is worst
                same = (np.isnan(g64) & np.isnan(t64)) | (g64 == t64)
                err[bad] = np.where(same[bad], 0.0, np.inf)
            finite = err[np.isfinite(g64) & np.isfinite(t64)]
            if max_abs > 0:
                counts += np.histogram(finite, edges)[0]
            else:
                counts[0] += finite.size
            k = min(WORST, err.size)
            top = np.argpartition(err, err.size - k)[err.size - k :]
            best_idx = np.concatenate([best_idx, top + offset])
            best = np.concatenate([best, np.stack([err[top], g64[top], t64[top]], axis=1)])
            keep = np.argsort(-best[:, 0], kind="stable")[:WORST]
            best_idx, best = best_idx[keep], best[keep]
            offset += gc.size
    except (OSError, ValueError):
        return [], [], []
    shape = tuple(g.shape) or (1,)
    worst = [
        WorstElement(
            index=tuple(int(i) for i in np.unravel_index(int(flat), shape)) if g.shape else (),
            golden=float(gv),
            target=float(tv),
            abs_err=float(err),
            rel_err=float(err / max(abs(gv), floor)) if math.isfinite(gv) else math.inf,
        )
        for flat, (err, gv, tv) in zip(best_idx, best, strict=True)
        if err > 0
    ]
    return [float(e) for e in edges], [int(c) for c in counts], worst


def sentence(result: PairResult, inputs: list[PairResult]) -> str:
    """Why the pair was flagged (or why it passes), in one sentence."""
    verdict = result.verdict
    if verdict is Verdict.ERROR:
        return f"could not compare: {result.reason}"
    if verdict is Verdict.UNPAIRED:
        return f"only one run has this tensor{': ' + result.reason if result.reason else ''}"
    if verdict is Verdict.DIVERGED:
        return (
            result.reason
            or "not blamed: the target was fed different input ids at an earlier token"
        )
    bad_inputs = [i for i in inputs if i.verdict in (Verdict.FAIL, Verdict.ERROR, Verdict.DIVERGED)]
    if verdict is Verdict.PASS:
        if bad_inputs:
            return f"output passes although {_input_text(bad_inputs[0])}: this operator absorbed the difference"
        return "every gated metric is within its limit"
    what = "output " + result.reason.rsplit(" (", 1)[0]
    if not inputs:
        return f"{what}; no inputs were captured, so upstream cannot be ruled out"
    if not bad_inputs:
        n = len(inputs)
        return f"{what} while {'the input passes' if n == 1 else f'all {n} inputs pass'}: this operator introduced the error"
    return f"inputs already differ ({_input_text(bad_inputs[0])}): error propagated from upstream"


def _input_text(result: PairResult) -> str:
    stem = result.key.stem
    if COSINE in result.metrics and (COSINE in result.failed or not result.failed):
        return f"{stem} cos {fmt_value(COSINE, result.metrics[COSINE])}"
    return f"{stem}: {result.reason.rsplit(' (', 1)[0] or result.verdict.value}"
