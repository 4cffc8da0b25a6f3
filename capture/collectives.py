"""Tensor parallel capture: the rank of this process, and collectives as nodes of the graph.

``register_hook`` in a process with ``torch.distributed`` initialised (or launched by ``torchrun``,
whose ``RANK``/``WORLD_SIZE`` say the same before ``init_process_group`` runs) writes
``{dump_path}/rank{r}/`` with ``rank``, ``world_size`` and ``backend`` in the manifest.

Collectives called inside a hooked model's forward (``all_reduce``, ``all_gather``,
``all_gather_into_tensor``, ``reduce_scatter_tensor``, ``broadcast``) become nodes named after
the innermost hooked module that runs them, the collective and its call index in that module at
this token (``root.layers.1.down.all_reduce.0``): ``input_0`` copied *before* the call (an
all-reduce works in place), ``output`` (``output_i`` for ``all_gather``'s list) after it. An
index line ``{"k": "collective", "token", "node", "op", "world_size", "rank"}`` records the
reduction op, which ``layerwatch allreduce`` (``engine/allreduce.py``) needs for its golden.

The ``torch.distributed`` functions are wrapped at each root forward call and restored when it
returns (and when the hooks are removed), wrapping whatever is installed *then*: a wrapper the
program put there itself (a quantised all-reduce, a fault injector) is part of the collective
we see. An ``async_op=True`` call is waited on before its output is copied (the copy must see
the result); the returned work object is already complete.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from . import format as fmt
from .handoff import LineItem

COLLECTIVES = fmt.COLLECTIVE_TYPES
K_COLLECTIVE = fmt.K_COLLECTIVE
RANK_DIR_PREFIX = "rank"
STACK_DEPTH = 64
"""Frames searched for the module that called a collective (torch's own wrappers sit between)."""


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits in its tensor-parallel job."""

    rank: int
    world_size: int
    backend: str

    @property
    def dir_name(self) -> str:
        return f"{RANK_DIR_PREFIX}{self.rank}"

    def describe(self) -> dict[str, Any]:
        return {"rank": self.rank, "world_size": self.world_size, "backend": self.backend}


def rank_info() -> RankInfo | None:
    """This process's rank: from ``torch.distributed`` once initialised, else from the
    environment ``torchrun`` sets (the zero-code capture may attach before ``init_process_group``);
    ``None`` in a plain single process."""
    dist = _dist()
    if dist is not None and dist.is_initialized():
        try:
            backend = str(dist.get_backend())
        except (RuntimeError, ValueError):
            backend = ""
        return RankInfo(dist.get_rank(), dist.get_world_size(), backend)
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None or world is None:
        return None
    try:
        return RankInfo(int(rank), int(world), "")
    except ValueError:
        return None


def _dist() -> Any:
    try:
        import torch.distributed as dist
    except ImportError:  # a build without distributed support
        return None
    return dist if dist.is_available() else None


def _op_name(op: Any) -> str:
    """``SUM``/``MAX``/``MIN``/``AVG``/``PRODUCT`` from a ``ReduceOp`` (its str is ``RedOpType.SUM``)."""
    name = getattr(op, "name", None) or str(op)
    return str(name).rsplit(".", 1)[-1].upper()


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str, default: Any) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else default


def _bump(t: Any) -> None:
    """Mark an in-place collective's result as modified: c10d writes the storage without
    touching the version counter, so the recorder would take the result for the unmodified
    input it copied before the call."""
    if isinstance(t, torch.Tensor):
        # inference-mode tensors have no version counter (and are never de-duplicated)
        with contextlib.suppress(RuntimeError):
            torch.autograd.graph.increment_version(t)


class CollectivePatch:
    """The wrappers of one capture: ``install()`` at each root call, ``restore()`` after it."""

    def __init__(
        self, recorder: Any, info: RankInfo, config: Any, names: dict[int, str] | None = None
    ) -> None:
        self.recorder = recorder
        self.names = names or {}
        """``id(module)`` → node name of every module of the hooked model (the caller's name)."""
        self.info = info
        self.config = config
        """The capture's ``DumpConfig``: ``layer_name`` globs and ``tensor_part`` apply to
        collective nodes as to modules (``module_list`` and ``dump_last_logits`` skip them)."""
        self.saved: dict[str, Callable[..., Any]] = {}
        self.wrappers: dict[str, Callable[..., Any]] = {}
        self.inside = False
        """A collective implemented with another (all_gather over broadcast...) is one node."""

    def install(self, *_: Any) -> None:
        dist = _dist()
        if dist is None or self.saved:
            return
        for name in COLLECTIVES:
            current = getattr(dist, name, None)
            if current is None:
                continue
            wrapper = self._wrap(name, current)
            self.saved[name] = current
            self.wrappers[name] = wrapper
            setattr(dist, name, wrapper)

    def restore(self, *_: Any) -> None:
        dist = _dist()
        for name, original in self.saved.items():
            if dist is not None and getattr(dist, name, None) is self.wrappers[name]:
                setattr(dist, name, original)  # replaced again meanwhile: theirs stays
        self.saved.clear()
        self.wrappers.clear()

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def collective(*args: Any, **kwargs: Any) -> Any:
            rec = self.recorder
            if self.inside or not rec.active or rec.stopped:
                return fn(*args, **kwargs)
            self.inside = True
            try:
                return self._call(name, fn, args, kwargs)
            finally:
                self.inside = False

        return collective

    def _call(
        self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        rec = self.recorder
        op = "SUM"
        if name in ("all_reduce", "broadcast"):
            src = _arg(args, kwargs, 0, "tensor", None)
            outs: Any = src
            if name == "all_reduce":
                op = _op_name(_arg(args, kwargs, 1, "op", "SUM"))
            else:
                op = f"SRC{_arg(args, kwargs, 1, 'src', 0)}"
        elif name == "all_gather":
            outs = _arg(args, kwargs, 0, "tensor_list", None)
            src = _arg(args, kwargs, 1, "tensor", None)
            op = "GATHER"
        else:  # all_gather_into_tensor / reduce_scatter_tensor / *_single (output, input, ...)
            outs = _arg(args, kwargs, 0, "output_tensor", None)
            if outs is None:
                outs = kwargs.get("output")
            src = _arg(args, kwargs, 1, "input_tensor", None)
            if src is None:
                src = kwargs.get("input")
            op = (
                "GATHER"
                if name.startswith("all_gather")
                else _op_name(_arg(args, kwargs, 2, "op", "SUM"))
            )
        node = self._node(name)
        config = self.config
        if config.dump_last_logits or not config.selects(node, None):
            return fn(*args, **kwargs)
        items: list[Any] = []
        try:
            if isinstance(src, torch.Tensor) and config.want_inputs:
                items.append(self._copy("input_0", src, node, name))
        except Exception as exc:  # capture stops, the collective still runs
            rec.fail(exc)
            return fn(*args, **kwargs)
        result = fn(*args, **kwargs)
        if kwargs.get("async_op") and result is not None and hasattr(result, "wait"):
            result.wait()
        want_out = config.tensor_part in (1, 2)
        try:
            if isinstance(outs, torch.Tensor):
                _bump(outs)
                if want_out:
                    items.append(self._copy("output", outs, node, name))
            elif isinstance(outs, list | tuple):
                for i, t in enumerate(outs):
                    _bump(t)
                    if want_out:
                        items.append(self._copy(f"output_{i}", t, node, name))
            self._hand(node, name, op, items)
        except Exception as exc:
            rec.fail(exc)
        return result

    def _node(self, name: str) -> str:
        """``{innermost hooked module's node}.{collective}.{n}``: n counts this collective's
        calls in that module at this token (a module's second call is its own node, ``x#1``).
        The calling module is the innermost one of the model on the Python stack, whatever the
        filters select (its node with ``#n`` when its input pre-hook named that call)."""
        rec = self.recorder
        module = self._caller()
        base = "root" if module is None else self.names[id(module)]
        for held, node, _ in reversed(rec.frames):
            if held is module:
                base = node
                break
        prefix = f"{base}.{name}"
        n = rec.calls.get(prefix, 0)
        rec.calls[prefix] = n + 1
        return f"{prefix}.{n}"

    def _caller(self) -> Any:
        """The innermost module of the hooked model whose ``forward`` is on the stack."""
        frame: types.FrameType | None = sys._getframe(3)
        names = self.names
        for _ in range(STACK_DEPTH):
            if frame is None:
                return None
            obj = frame.f_locals.get("self")
            if obj is not None and id(obj) in names:
                return obj
            frame = frame.f_back
        return None

    def _copy(self, stem: str, t: torch.Tensor, node: str, type_: str) -> Any:
        return self.recorder.capture_one(stem, t.detach(), node, type_)

    def _hand(self, node: str, type_: str, op: str, items: list[Any]) -> None:
        """Queue the call's tensors as one node completing now, and its op line."""
        rec = self.recorder
        order = rec.order
        rec.order = order + 1
        rec.last_order = order
        rec.emit(order, items)
        rec.batch.append(
            LineItem(
                {
                    "k": K_COLLECTIVE,
                    "token": rec.token,
                    "node": node,
                    "type": type_,
                    "op": op,
                    "world_size": self.info.world_size,
                    "rank": self.info.rank,
                }
            )
        )


__all__ = ["COLLECTIVES", "K_COLLECTIVE", "CollectivePatch", "RankInfo", "rank_info"]
