"""The module tree of a captured model: ``topology.json`` (ours) and ``model_tree.json`` (msit's).

``topology.json`` (ARCHITECTURE.md, the dump format): ``{"format": "layerwatch-topology", "version": 1, "root": "root",
"nodes": [{"name", "type", "parent", "order", "params": {local name: fingerprint}}]}`` with nodes
in declaration order, ``order`` = completion order at the first dumped token (-1 until known),
and ``params`` = fingerprints of each module's *direct* parameters (the fields of
``engine.records.ParamPrint``), taken once at registration so that golden and target modules
with identical weights can be paired even when their names differ.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
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
