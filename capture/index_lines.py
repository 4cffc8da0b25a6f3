"""Index lines of the layerwatch format, formatted directly (the hot part of the writer).

Same JSON as ``capture.format.IndexTensor.to_json`` / ``encode_line``: NaN and infinite
statistics are written as the strings ``"nan"``, ``"inf"``, ``"-inf"``. The part of a tensor
line that its aliases share (dtype, shape, file, offsets, statistics) is formatted once, and
the parts that repeat at every token (node, stem, type; a shape) are formatted once per run:
a long generation writes the same ~150 keys at every token, so per line only the numbers are
new (one ``%`` format each, no ``json.dumps`` call).
"""

from __future__ import annotations

import json
import math
from typing import Any

from .handoff import TensorItem

HEADS: dict[tuple[str, str, str], str] = {}
"""(node, stem, type) -> the head of its tensor lines: the same ~150 keys come back every token."""
_SHAPES: dict[tuple[int, ...], str] = {}
_SHAPES_MAX = 1 << 16
_LOW, _HIGH = float("-inf"), float("inf")
_FINITE_STATS = '{"max":%r,"min":%r,"mean":%r,"norm":%r,"nan":0,"inf":0}'


def _num(x: float) -> str:
    return repr(x) if math.isfinite(x) else f'"{x!r}"'


def shape_text(shape: Any) -> str:
    """``2,3,4`` for a shape (the inside of its JSON list), cached: shapes repeat every token."""
    if type(shape) is list:
        shape = tuple(shape)
    text = _SHAPES.get(shape)
    if text is None:
        if len(_SHAPES) >= _SHAPES_MAX:  # growing sequence lengths: keep the cache bounded
            _SHAPES.clear()
        text = _SHAPES[tuple(shape)] = ",".join(map(str, shape))
    return text


def stats_text(st: tuple[float, float, float, float, int, int] | None) -> str:
    """The ``stats`` object of a tensor line (``null`` when there are none)."""
    if st is None:
        return "null"
    mx, mn, mean, norm, nan, inf = st
    # comparisons, not calls: false for NaN and for either infinity
    if not nan and not inf and _LOW < mn <= mx < _HIGH and _LOW < mean < _HIGH and norm < _HIGH:
        return _FINITE_STATS % (mx, mn, mean, norm)
    return (
        f'{{"max":{_num(mx)},"min":{_num(mn)},"mean":{_num(mean)},'
        f'"norm":{_num(norm)},"nan":{nan},"inf":{inf}}}'
    )


def head_text(node: str, stem: str, node_type: str) -> str:
    """``"node":..,"stem":..,"type":..`` of a tensor line, cached in :data:`HEADS`."""
    head = HEADS[(node, stem, node_type)] = (
        f'"node":{json.dumps(node)},"stem":{json.dumps(stem)},"type":{json.dumps(node_type)}'
    )
    return head


_FINITE_TAIL = (
    '"dtype":"%s","shape":[%s],"file":"%s","begin":%d,"end":%d,"stats":' + _FINITE_STATS + "}\n"
)


def tail_text(src: TensorItem) -> str:
    """The end of a tensor line that every alias of ``src`` shares, cached on ``src``."""
    st = src.stats
    if st is not None:  # finite statistics (nearly all): one format for the whole tail
        mx, mn, mean, norm, nan, inf = st
        if not nan and not inf and _LOW < mn <= mx < _HIGH and _LOW < mean < _HIGH and norm < _HIGH:
            tail = src.tail = _FINITE_TAIL % (
                src.dtype_name,
                shape_text(src.shape),
                src.file,
                src.begin,
                src.end,
                mx,
                mn,
                mean,
                norm,
            )
            return tail
    tail = src.tail = (
        f'"dtype":"{src.dtype_name}","shape":[{shape_text(src.shape)}],"file":"{src.file}",'
        f'"begin":{src.begin},"end":{src.end},"stats":{stats_text(st)}}}\n'
    )
    return tail


def tensor_line(it: TensorItem) -> str:
    """One ``K_TENSOR`` line (the same JSON as ``IndexTensor.to_json``), formatted directly.

    ``capture/writer.py`` inlines this for the batch; keep the two the same.
    """
    src = it.alias if it.alias is not None else it
    tail = src.tail or tail_text(src)
    head = HEADS.get((it.node, it.stem, it.node_type)) or head_text(it.node, it.stem, it.node_type)
    return f'{{"k":"t","token":{it.token},{head},"order":{it.order},{tail}'
