"""Turn a module's arguments and return value into ``(stem, tensor)`` pairs.

Stems are msit's file stems, extended to what msit cannot see (ARCHITECTURE.md, "Names"):

* positional inputs ``input_0``, ``input_1``; nested tuples/lists ``input_1_0`` (recursive
  ``_{i}`` like msit); keyword inputs ``input_<name>`` / ``input_<name>_0``;
* a single tensor output ``output``; tuple/list outputs ``output_0``, ``output_1_0``;
  dict, dataclass and Hugging Face ``ModelOutput`` fields ``output_<field>``.

Anything else (``None``, ints, Hugging Face ``Cache`` objects, strings) is skipped quietly:
such values have no tensor payload of their own to compare.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

Tensor = torch.Tensor
MAX_DEPTH = 6
"""Containers nested deeper than this are not searched (guards against cyclic structures)."""

_INPUT_STEMS = tuple(f"input_{i}" for i in range(16))


_SCALARS = frozenset({type(None), bool, int, float, str})
_WALKABLE: dict[type, bool] = {}


def _walkable(value: Any) -> bool:
    """Whether ``value`` may hold tensors we report (containers, dataclasses), cached per type."""
    kind = type(value)
    known = _WALKABLE.get(kind)
    if known is None:
        known = _WALKABLE[kind] = issubclass(
            kind, list | tuple | Mapping
        ) or dataclasses.is_dataclass(kind)
    return known


def flatten_inputs(
    args: tuple[Any, ...], kwargs: Mapping[str, Any] | None
) -> list[tuple[str, Tensor]]:
    """Positional then keyword inputs, in call order."""
    found: list[tuple[str, Tensor]] = []
    for i, arg in enumerate(args):
        if isinstance(arg, Tensor):
            found.append((_INPUT_STEMS[i] if i < 16 else f"input_{i}", arg))
        elif type(arg) not in _SCALARS and _walkable(arg):
            _walk(arg, _INPUT_STEMS[i] if i < 16 else f"input_{i}", found, 1)
    if kwargs:
        for name, value in kwargs.items():
            if isinstance(value, Tensor):
                found.append(("input_" + name, value))
            elif type(value) not in _SCALARS and _walkable(value):
                _walk(value, "input_" + name, found, 1)
    return found


def flatten_output(output: Any) -> list[tuple[str, Tensor]]:
    """Every tensor inside a module's return value."""
    if isinstance(output, Tensor):
        return [("output", output)]
    found: list[tuple[str, Tensor]] = []
    _walk(output, "output", found, 0)
    return found


def _walk(value: Any, prefix: str, found: list[tuple[str, Tensor]], depth: int) -> None:
    if depth > MAX_DEPTH:
        return
    if isinstance(value, list | tuple):
        items: Any = enumerate(value)
    elif isinstance(value, Mapping):  # dicts and HF ModelOutput (an OrderedDict of set fields)
        items = value.items()
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = ((f.name, getattr(value, f.name, None)) for f in dataclasses.fields(value))
    else:
        return
    for key, item in items:
        if isinstance(item, Tensor):
            found.append((f"{prefix}_{key}", item))
        elif type(item) not in _SCALARS and _walkable(item):
            _walk(item, f"{prefix}_{key}", found, depth + 1)


def first_int_tensor(args: tuple[Any, ...], kwargs: Mapping[str, Any] | None) -> Tensor | None:
    """The root's input ids: the ``input_ids`` keyword, else the first integer tensor argument."""
    if kwargs:
        ids = kwargs.get("input_ids")
        if isinstance(ids, Tensor):
            return ids
    for arg in args:
        if (
            isinstance(arg, Tensor)
            and not arg.is_floating_point()
            and not arg.is_complex()
            and arg.dtype is not torch.bool
        ):
            return arg
    return None  # keyword tensors such as position_ids are not token ids: do not guess
