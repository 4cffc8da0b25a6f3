"""Index lines of the layerwatch format, formatted directly (the hot part of the writer).

Same JSON as ``capture.format.IndexTensor.to_json`` / ``encode_line``: NaN and infinite
statistics are written as the strings ``"nan"``, ``"inf"``, ``"-inf"``. The part of a tensor
line that its aliases share (dtype, shape, file, offsets, statistics) is formatted once.
"""

from __future__ import annotations

import json
import math

from .handoff import TensorItem

_HEADS: dict[tuple[str, str, str], str] = {}


def _num(x: float) -> str:
    return repr(x) if math.isfinite(x) else f'"{x!r}"'


def tensor_line(it: TensorItem) -> str:
    """One ``K_TENSOR`` line (the same JSON as ``IndexTensor.to_json``), formatted directly."""
    src = it.alias if it.alias is not None else it
    key = (it.node, it.stem, it.node_type)
    head = _HEADS.get(key)
    if head is None:
        head = _HEADS[key] = (
            f'"node":{json.dumps(it.node)},"stem":{json.dumps(it.stem)},'
            f'"type":{json.dumps(it.node_type)}'
        )
    tail = src.tail
    if tail is None:  # the part every alias of this tensor shares: computed once
        st = src.stats
        if st is None:
            stats = "null"
        else:
            mx, mn, mean, norm, nan, inf = st
            stats = (
                f'{{"max":{_num(mx)},"min":{_num(mn)},"mean":{_num(mean)},'
                f'"norm":{_num(norm)},"nan":{nan},"inf":{inf}}}'
            )
        shape = ",".join(map(str, src.shape))
        tail = src.tail = (
            f'"dtype":"{src.dtype_name}","shape":[{shape}],"file":"{src.file}",'
            f'"begin":{src.begin},"end":{src.end},"stats":{stats}}}\n'
        )
    return f'{{"k":"t","token":{it.token},{head},"order":{it.order},{tail}'
