"""Logits-only metrics: KL divergence, top-1 agreement, top-k overlap, golden top-2 margin.

A logits tensor is read as rows over the vocabulary axis (``[..., V]`` → ``[rows, V]``): one
row per token position. Everything is computed per row, in float64, whatever the stored
dtype (msit computes KL in the target dtype: bf16 gives KL ≈ 0.01 for near-identical logits).
KL is never computed over a flattened activation.

Aggregates over rows:

* ``kl_divergence`` = **max** over rows of KL(softmax(g) ‖ softmax(t)). The worst position
  decides: a single corrupted token distribution must not be averaged away by the others.
  Rows with NaN or +Inf on either side are left out (the NaN/Inf metrics report them).
* ``top1_agreement`` = share of rows whose argmax agrees.
* ``topk_overlap`` = mean over rows of |top-k(g) ∩ top-k(t)| / k (k = 5 by default).
* ``golden_top2_margin`` = the **largest** golden top-1 minus top-2 logit among rows whose
  argmax disagrees (the most confident flip), 0.0 when every row agrees. A flip whose golden
  margin is within noise is a near-tie, not a fault; the thresholds judge that.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
from layerwatch.engine.records import KL, MARGIN, TOP1, TOPK

ROW_BLOCK_ELEMS = 1 << 18
"""Float64 elements per row block (≈ 2 MiB per temporary)."""

MAX_VOCAB = 1 << 20
"""Largest last axis read as a vocabulary (real vocabularies are up to ~262 k): a root output
with a longer last axis, or a 1-D one, is a plain tensor (:func:`logits_shaped`)."""


class LogitsAccumulator:
    """Streaming logits metrics over blocks of whole rows ``[R, V]``."""

    def __init__(self, vocab: int, k: int = 5) -> None:
        self.vocab = vocab
        self.k = max(1, min(k, vocab)) if vocab else 1
        self.rows = 0
        self.agree = 0
        self.overlap = 0.0
        self.kl_max = 0.0
        self.margin = 0.0

    def update(self, golden: np.ndarray, target: np.ndarray) -> None:
        """Add a block of rows (2-D, same shape, last axis = vocabulary)."""
        if golden.size == 0:
            return
        step = max(1, ROW_BLOCK_ELEMS // max(self.vocab, 1))
        for start in range(0, golden.shape[0], step):
            self._block(golden[start : start + step], target[start : start + step])

    def _block(self, gb: np.ndarray, tb: np.ndarray) -> None:
        g = gb.astype(np.float64)
        t = tb.astype(np.float64)
        mg = g.max(axis=1)
        mt = t.max(axis=1)
        ok = np.isfinite(mg) & np.isfinite(mt)  # max is NaN with any NaN, +inf with any +inf
        if not ok.all():  # such rows are the NaN/Inf metrics' business
            g, t, mg, mt = g[ok], t[ok], mg[ok], mt[ok]
        if not g.shape[0]:
            return
        self.rows += g.shape[0]
        agree = g.argmax(axis=1) == t.argmax(axis=1)
        self.agree += int(np.count_nonzero(agree))
        if self.vocab > 1 and not agree.all():
            top2 = np.partition(g[~agree], self.vocab - 2, axis=1)[:, -2:]
            self.margin = max(self.margin, float(np.max(top2[:, 1] - top2[:, 0])))
        k = self.k
        top_g = np.argpartition(g, self.vocab - k, axis=1)[:, self.vocab - k :]
        top_t = np.argpartition(t, self.vocab - k, axis=1)[:, self.vocab - k :]
        self.overlap += float((top_g[:, :, None] == top_t[:, None, :]).any(axis=2).sum()) / k
        self.kl_max = max(self.kl_max, float(_kl_rows(g, t, mg, mt).max()))

    def result(self) -> dict[str, float]:
        rows = self.rows
        return {
            KL: self.kl_max,
            TOP1: self.agree / rows if rows else 1.0,
            TOPK: self.overlap / rows if rows else 1.0,
            MARGIN: self.margin,
        }


def _kl_rows(g: np.ndarray, t: np.ndarray, mg: np.ndarray, mt: np.ndarray) -> np.ndarray:
    """KL(softmax(g) ‖ softmax(t)) per row in float64 (rows finite-max; ``m*`` = row maxima)."""
    lg = g - mg[:, None]
    lg -= np.log(np.exp(lg).sum(axis=1))[:, None]
    lt = t - mt[:, None]
    lt -= np.log(np.exp(lt).sum(axis=1))[:, None]
    p = np.exp(lg)
    with np.errstate(invalid="ignore"):
        lg -= lt  # log p - log q
        lg *= p
    lg[p == 0.0] = 0.0  # 0·log(0/q) = 0, also where q = 0 (−inf − −inf)
    kl = lg.sum(axis=1)
    return np.maximum(kl, 0.0)  # KL ≥ 0; only float64 rounding (~1e-17) can go below


def logits_rows(array: np.ndarray, vocab_axis: int = -1) -> np.ndarray:
    """``[..., V, ...]`` → ``[rows, V]`` with the vocabulary axis last."""
    if array.ndim == 0:
        return array.reshape(1, 1)
    moved = np.moveaxis(array, vocab_axis, -1)
    return moved.reshape(-1, moved.shape[-1]) if moved.shape[-1] else moved.reshape(0, 0)


def logits_shaped(shape: tuple[int, ...], *, one_row: bool = False) -> bool:
    """Whether a tensor of ``shape`` is read as logits rows: at least 2-D (positions × vocab;
    1-D too with ``one_row``, for the known logits node) and a last axis of at most
    :data:`MAX_VOCAB`. Anything else is compared as a plain tensor, never as one huge
    vocabulary row."""
    return len(shape) >= (1 if one_row else 2) and 0 < shape[-1] <= MAX_VOCAB


def row_blocks(
    pairs: Iterable[tuple[np.ndarray, np.ndarray]], vocab: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Regroup equal-length 1-D chunk pairs (C order, vocabulary last) into whole-row blocks.

    Only a partial row is carried between chunks, so memory stays one chunk plus one row. The
    partial row is kept as a list of pieces and joined once, when it is whole: joining it again
    for every chunk made a row longer than a chunk cost time quadratic in the row's length.
    """
    pieces_g: list[np.ndarray] = []
    pieces_t: list[np.ndarray] = []
    held = 0
    for g, t in pairs:
        if held:
            need = vocab - held
            pieces_g.append(g[:need].copy())
            pieces_t.append(t[:need].copy())
            taken = min(need, g.size)
            held += taken
            g, t = g[taken:], t[taken:]
            if held < vocab:
                continue
            head_g, head_t = np.concatenate(pieces_g), np.concatenate(pieces_t)
            pieces_g, pieces_t, held = [], [], 0
            yield head_g.reshape(1, vocab), head_t.reshape(1, vocab)
        whole = (g.size // vocab) * vocab
        if whole:
            yield g[:whole].reshape(-1, vocab), t[:whole].reshape(-1, vocab)
        if g.size > whole:
            pieces_g, pieces_t = [g[whole:].copy()], [t[whole:].copy()]
            held = g.size - whole
    if held:
        raise ValueError("logits stream ended inside a row")


def logits_metrics(
    golden: np.ndarray, target: np.ndarray, *, vocab_axis: int = -1, k: int = 5
) -> dict[str, float]:
    """Logits metrics of two in-memory arrays of the same shape."""
    g = logits_rows(golden, vocab_axis)
    t = logits_rows(target, vocab_axis)
    acc = LogitsAccumulator(g.shape[1] if g.ndim == 2 else 0, k)
    acc.update(g, t)
    return acc.result()
