"""Manual dump points: tensors that are not module outputs (attention scores inside a function).

``dump_data(label, tensor)`` (msit's name; ``set_label`` is msit's other spelling) puts
``tensor`` into every open capture (``register_hook``, or the zero-code ``layerwatch dump``) as
the output of a node at the current token, in execution order among the modules:

* the node is named after where the call happens: inside ``with dump_region("attn"):`` it is
  ``root.attn.{label}``; else inside a hooked module it is ``{that module's node}.{label}``
  (``root.model.layers.0.self_attn.scores``), so the point lands in its layer's grid column
  and pairs with the same point of the other run by name; else ``root.{label}``;
* a second call with the same node at one token becomes ``{node}#1`` (as a module called twice);
  with another shape than the first one it also prints one warning: two different tensors
  under one label would be compared with each other's counterparts;
* outside a selected token, or with no capture open, nothing is written (the calls can stay in
  the code; the first call without any capture says so once on stderr).

A label is a name, not a path: letters, digits, ``_``, ``-`` and ``.`` (dots nest). Anything
else raises :class:`LayerwatchError` at the call, naming the label.
"""

from __future__ import annotations

import contextlib
import re
import sys
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from .errors import LayerwatchError

NODE_TYPE = "dump_data"
"""The node type manual points get in the index (a module's is its class name)."""
_LABEL = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_regions: list[str] = []
_shapes: weakref.WeakKeyDictionary[Any, dict[tuple[int, str], tuple[int, ...]]] = (
    weakref.WeakKeyDictionary()
)
"""Per recorder: the shape of the first tensor dumped under each node at each token."""
_said_no_capture = False


def _check(label: object, what: str = "label") -> str:
    if not isinstance(label, str) or not _LABEL.match(label) or ".." in label:
        raise LayerwatchError(
            f"dump_data: {what} {label!r} is not a name: use letters, digits, _ - and . "
            "(e.g. 'attn.scores')"
        )
    return label.strip(".")


@contextlib.contextmanager
def dump_region(name: str) -> Iterator[None]:
    """Tag a region of code: ``dump_data`` points inside it are named ``root.{name}.{label}``
    (regions nest), whatever module they run in."""
    _regions.append(_check(name, "region"))
    try:
        yield
    finally:
        _regions.pop()


def dump_data(
    data_id: str,
    data: torch.Tensor | None = None,
    *,
    golden_data: torch.Tensor | None = None,
) -> None:
    """Dump ``data`` under the label ``data_id`` at the current token (see the module doc).

    ``golden_data=`` is msit's keyword for the tensor and is accepted as an alias.
    """
    label = _check(data_id)
    tensor = data if data is not None else golden_data
    if not isinstance(tensor, torch.Tensor):
        raise LayerwatchError(
            f"dump_data: {label!r} needs a torch.Tensor, got {type(tensor).__name__}"
        )
    from .hooks import _OPEN

    recorders = [h._recorder for h in list(_OPEN) if h._recorder is not None]
    if not recorders:
        global _said_no_capture
        if not _said_no_capture:
            _said_no_capture = True
            print(
                f"layerwatch: dump_data({label!r}) outside any capture: nothing is written "
                "(register_hook or layerwatch dump first)",
                file=sys.stderr,
            )
        return
    for rec in recorders:
        if rec.active and not rec.stopped:
            _record(rec, label, tensor.detach())


def set_label(
    data_id: str,
    data_val: torch.Tensor | None = None,
    *,
    data_src: str | None = None,
    tensor_path: str | None = None,
) -> None:
    """msit's ``set_label(data_src=, data_id=, data_val=)``: the same as :func:`dump_data`.

    ``data_src`` (msit's ``"pta"``/``"acl"``) is accepted and ignored: here each run writes its
    own dump and the two are paired by label. ``tensor_path`` (a file written by another
    runtime) is not read in the model process: dump the tensor itself.
    """
    if tensor_path is not None:
        raise LayerwatchError(
            f"set_label: {data_id!r}: tensor_path is not supported; pass data_val=tensor "
            "(point layerwatch at the other runtime's dump instead)"
        )
    dump_data(data_id, data_val)


def _record(rec: Any, label: str, tensor: torch.Tensor) -> None:
    """Hand one manual point to ``rec`` (a ``capture/recorder.py`` Recorder) as a node output."""
    if _regions:
        base = "root." + ".".join(_regions) + "." + label
    elif rec.frames:
        base = f"{rec.frames[-1][1]}.{label}"
    else:
        base = f"root.{label}"
    n = rec.calls.get(base, 0)
    rec.calls[base] = n + 1
    node = base if n == 0 else f"{base}#{n}"
    shape = tuple(tensor.shape)
    seen = _shapes.setdefault(rec, {})
    first = seen.setdefault((rec.token, base), shape)
    if first != shape:
        print(
            f"layerwatch: dump_data label {label!r} at token {rec.token} in {base.rsplit('.', 1)[0]} "
            f"was used for shapes {list(first)} and {list(shape)}; the second is {node}: "
            "give different tensors different labels",
            file=sys.stderr,
        )
    try:
        item = rec.capture_one("output", tensor, node, NODE_TYPE)
        order = rec.order
        rec.order = order + 1
        rec.last_order = order
        rec.emit(order, [item])
    except Exception as exc:  # capture stops, the model goes on (the hooks' policy)
        rec.fail(exc)


__all__ = ["dump_data", "dump_region", "set_label"]
