"""The module tree of a captured model: ``topology.json`` (ours) and ``model_tree.json`` (msit's).

``topology.json`` (ARCHITECTURE.md, the dump format): ``{"format": "layerwatch-topology", "version": 1, "root": "root",
"nodes": [{"name", "type", "parent", "order", "params": {local name: fingerprint}}]}`` with nodes
in declaration order, ``order`` = completion order at the first dumped token (-1 until known),
and ``params`` = fingerprints of each module's *direct* parameters (the fields of
``engine.records.ParamPrint``), taken once at registration so that golden and target modules
with identical weights can be paired even when their names differ.

Each node also carries ``class`` (the module's qualified class name,
``transformers.models.gemma.modeling_gemma.GemmaRMSNorm``) and ``attrs`` (its scalar attributes:
eps, approximate, normalized_shape, padding_idx, dim, p, training, ``has_bias``...): what
``layerwatch precheck`` needs to recompute an operator from its dumped inputs and weights, and
what tells two look-alike classes (Llama's ``w·x̂`` and Gemma's ``(1+w)·x̂``) apart. Both keys
are optional for readers (older dumps lack them).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # imported where used: the writer process needs with_order, not torch
    import torch

TOPOLOGY_FORMAT = "layerwatch-topology"
TOPOLOGY_VERSION = 1
HEAD = 16
"""Number of leading values kept in a parameter fingerprint."""
_CHUNK = 1 << 20


def node_name(path: str) -> str:
    """``""`` → ``root``; ``model.layers.0`` → ``root.model.layers.0`` (msit's naming)."""
    return "root." + path if path else "root"


def named_nodes(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """Every module once (shared modules under their first name), root first."""
    return [(node_name(path), module) for path, module in model.named_modules()]


def param_print(param: torch.Tensor) -> dict[str, Any]:
    """Fingerprint of one parameter: float64 sums of its values cast to float32, and its head.

    Summed on the host in float64 chunks (numpy), so the cost is one pass over the weights and
    the result does not depend on a device's reduction order.
    """
    import torch

    values = param.detach()
    if values.is_complex():
        values = values.real
    flat = values.reshape(-1)
    total = abs_total = squares = 0.0
    for start in range(0, flat.numel(), _CHUNK):
        chunk = flat[start : start + _CHUNK].to("cpu", torch.float32).numpy().astype(np.float64)
        total += float(chunk.sum())
        abs_total += float(np.abs(chunk).sum())
        squares += float(np.dot(chunk, chunk))
    head = flat[:HEAD].to("cpu", torch.float32).tolist()
    return {
        "shape": list(values.shape),
        "dtype": str(param.dtype).removeprefix("torch."),
        "sum": total,
        "abs_sum": abs_total,
        "norm": math.sqrt(squares),
        "head": head,
    }


_SCALARS = (bool, int, float, str)


def _scalar(value: Any) -> Any:
    """A JSON-able scalar (or tuple of them), else ``None`` (not recorded)."""
    if value is None or isinstance(value, _SCALARS):
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        return value
    if isinstance(value, tuple | list) and len(value) <= 8:  # torch.Size is a tuple
        items = [_scalar(v) for v in value]
        if all(v is not None and not isinstance(v, list) for v in items):
            return items
    return None


def module_class(module: torch.nn.Module) -> str:
    """``module.Class`` qualified name of the module's own class."""
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


def module_attrs(module: torch.nn.Module) -> dict[str, Any]:
    """The module's public scalar attributes (from its ``__dict__``), plus ``has_bias``.

    Taken at registration: a forward that temporarily changes an attribute (a wrong kernel)
    is not what the module says it computes, and precheck should judge against the latter.
    """
    attrs: dict[str, Any] = {}
    for key, value in vars(module).items():
        if key.startswith("_"):
            continue
        scalar = _scalar(value)
        if scalar is not None or value is None:
            attrs[key] = scalar
    if "bias" in module._parameters or hasattr(module, "bias"):
        attrs["has_bias"] = getattr(module, "bias", None) is not None
    return attrs


def build_topology(model: torch.nn.Module, *, params: bool = True) -> dict[str, Any]:
    """The ``topology.json`` object, every ``order`` still -1."""
    nodes = []
    for name, module in named_nodes(model):
        parent = None if name == "root" else name.rsplit(".", 1)[0]
        prints = {}
        if params:
            for local, param in module.named_parameters(recurse=False):
                prints[local] = param_print(param)
        nodes.append(
            {
                "name": name,
                "type": type(module).__name__,
                "class": module_class(module),
                "attrs": module_attrs(module),
                "parent": parent,
                "order": -1,
                "params": prints,
            }
        )
    return {"format": TOPOLOGY_FORMAT, "version": TOPOLOGY_VERSION, "root": "root", "nodes": nodes}


def with_order(topology: dict[str, Any], order: dict[str, int]) -> dict[str, Any]:
    """A copy of ``topology`` with the completion order of the first dumped token filled in."""
    nodes = [dict(node, order=order.get(node["name"], -1)) for node in topology["nodes"]]
    return dict(topology, nodes=nodes)


def model_tree(model: torch.nn.Module) -> dict[str, Any]:
    """msit's ``model_tree.json``: nested ``{"name", "type", "children"}`` in declaration order."""

    def build(name: str, module: torch.nn.Module) -> dict[str, Any]:
        children = [build(f"{name}.{child}", sub) for child, sub in module.named_children()]
        return {"name": name, "type": type(module).__name__, "children": children}

    return build("root", model)
