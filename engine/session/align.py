"""Make two tensors of one pair comparable when one run kept only the last position.

Hugging Face ``generate`` computes the LM head on the last position only (``logits_to_keep``),
while a hand-written model (or the golden run) keeps every position: ``[1, 1, V]`` against
``[1, 16, V]`` at prefill. Decoding only ever uses the last position, so comparing it is the
meaningful check; a shape-mismatch error would hide the logits of every prefill. The longer
side becomes a strided view of its last position — no copy, the loader reads the view.
"""

from __future__ import annotations

from dataclasses import replace

from layerwatch.engine.records import TensorRecord


def c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    step = 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(int(dim), 1)
    return tuple(reversed(strides))


def last_position(record: TensorRecord) -> TensorRecord | None:
    """The record restricted to index ``-1`` of its second-to-last axis (kept as size 1)."""
    loc = record.loc
    shape = tuple(record.shape)
    if loc is None or loc.layout or len(shape) < 2 or shape[-2] < 1:
        return None
    strides = loc.strides or c_strides(shape)
    new_shape = (*shape[:-2], 1, shape[-1])
    view = replace(
        loc,
        shape=new_shape,
        strides=strides,
        elem_offset=loc.elem_offset + (shape[-2] - 1) * strides[-2],
    )
    return replace(record, shape=new_shape, loc=view, stats=None)


def align_positions(
    golden: TensorRecord, target: TensorRecord
) -> tuple[TensorRecord, TensorRecord] | None:
    """``(golden, target)`` cut to their last position when they differ only there and one side
    holds a single position; ``None`` when the shapes differ otherwise (a real mismatch)."""
    gs, ts = tuple(golden.shape), tuple(target.shape)
    if gs == ts or len(gs) != len(ts) or len(gs) < 2 or gs[:-2] != ts[:-2] or gs[-1] != ts[-1]:
        return None
    if gs[-2] == 1 and ts[-2] > 1:
        cut = last_position(target)
        return (golden, cut) if cut is not None else None
    if ts[-2] == 1 and gs[-2] > 1:
        cut = last_position(golden)
        return (cut, target) if cut is not None else None
    return None
