"""The child half of ``layerwatch precheck --replay``: record operator statistics, replay, judge.

Loaded inside the target's own process by the capture bootstrap (``capture/autohook.py``
calls the ``entry`` the launcher names) once ``import torch`` finished. While the program
runs, torch's global forward hook sees every module call; for each call of an operator the
precheck supports (engine/precheck.py ``plan_for``, the one registry) it keeps only
statistics of the operator's first input — shape, dtype, count, min, max, mean, std —
merged per distinct *(operator, input shape, dtype, parameter shapes, forward)*. No tensor is
kept or written. The forward is part of the key so that a module whose ``forward`` was
replaced on the instance is replayed on its own, not hidden behind a healthy twin.

When the program exits (``atexit``, the model still alive), each distinct operator is called
once more, in this process and on its own device, with random inputs drawn from a normal of
the recorded mean and spread, clipped to the recorded range (integer ids: uniform over the
recorded range), and its output is judged against the float64 reference under the rounding
bound of engine/numerics/precheck.py — the same references and limits as ``layerwatch
precheck DUMP``. Results land in ``replay_{pid}.json`` in the run's output folder (a few KB;
engine/replay.py reads them). Any failure here prints one line and leaves the program be.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from layerwatch.capture.atomic import replacing
from layerwatch.capture.topology import module_attrs, module_class
from layerwatch.engine.numerics import precheck as ref
from layerwatch.engine.records import Node
from torch.nn.modules import module as torch_module

FORMAT = "layerwatch-replay"
VERSION = 1
RESULT_GLOB = "replay_*.json"
SEED = 20240
"""Random inputs are drawn from one fixed seed per operator: a rerun replays the same values."""

_active: ReplayRecorder | None = None


def install(settings: dict[str, Any]) -> ReplayRecorder:
    """The bootstrap's entry point (``entry`` in the launcher's settings)."""
    global _active
    if _active is None:
        _active = ReplayRecorder(Path(str(settings["dump_path"])))
    return _active


@dataclass(slots=True)
class OpStats:
    """One distinct operator: where it was first seen, its module, and its input's statistics."""

    node: str
    cls: str
    attrs: dict[str, Any]
    module: torch.nn.Module
    token: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    calls: int = 0
    count: int = 0
    lo: float = math.inf
    hi: float = -math.inf
    total: float = 0.0
    squares: float = 0.0
    nonfinite: int = 0

    acc: torch.Tensor | None = None
    """[min, max, Σx, Σx², finite count, non-finite count] on the input's device, float64:
    merged without a host sync per call (a GPU run is not stalled), read once at the end."""

    def add(self, x: torch.Tensor) -> None:
        """Merge one call's input (over its finite values)."""
        self.calls += 1
        flat = x.detach().reshape(-1)
        if flat.numel() == 0:
            return
        if flat.is_floating_point():
            f = flat.double()
            finite = torch.isfinite(f)
            inf = torch.tensor(math.inf, dtype=f.dtype, device=f.device)
            zero = torch.zeros((), dtype=f.dtype, device=f.device)
            kept = torch.where(finite, f, zero)
            n = finite.sum().double()
            figures = torch.stack(
                [
                    torch.where(finite, f, inf).min(),
                    torch.where(finite, f, -inf).max(),
                    kept.sum(),
                    (kept * kept).sum(),
                    n,
                    flat.numel() - n,
                ]
            )
        else:
            zero = torch.zeros((), dtype=torch.float64, device=flat.device)
            count = torch.tensor(float(flat.numel()), dtype=torch.float64, device=flat.device)
            figures = torch.stack(
                [flat.min().double(), flat.max().double(), zero, zero, count, zero]
            )
        if self.acc is None:
            self.acc = figures
        else:
            acc = self.acc
            self.acc = torch.cat(
                [
                    torch.minimum(acc[:1], figures[:1]),
                    torch.maximum(acc[1:2], figures[1:2]),
                    acc[2:] + figures[2:],
                ]
            )

    def settle(self) -> None:
        """Bring the accumulated figures to the host (once, before the replay)."""
        if self.acc is None:
            return
        lo, hi, total, squares, count, nonfinite = self.acc.tolist()
        self.lo, self.hi, self.total, self.squares = lo, hi, total, squares
        self.count, self.nonfinite = int(count), int(nonfinite)
        self.acc = None

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    @property
    def std(self) -> float:
        if not self.count:
            return 0.0
        return math.sqrt(max(self.squares / self.count - self.mean**2, 0.0))

    def ranges(self) -> dict[str, float | None]:
        def num(v: float) -> float | None:
            return v if math.isfinite(v) else None

        return {
            "min": num(self.lo),
            "max": num(self.hi),
            "mean": num(self.mean),
            "std": num(self.std),
            "count": self.count,
            "nonfinite": self.nonfinite,
        }


class _Local(threading.local):
    depth = 0


@dataclass
class ReplayRecorder:
    """Torch's global hooks that record statistics, and the replay at exit."""

    out: Path
    ops: dict[tuple[Any, ...], OpStats] = field(default_factory=dict)
    unsupported: dict[str, int] = field(default_factory=dict)
    token: int = -1
    """Index of the root model's current forward call (0 = the first)."""

    def __post_init__(self) -> None:
        self._plans: dict[int, Any] = {}
        self._names: dict[int, str] = {}
        self._root: torch.nn.Module | None = None
        self._local = _Local()
        self._lock = threading.Lock()
        self._replaying = False
        self._pre = torch_module.register_module_forward_pre_hook(self._on_pre)
        self._post = torch_module.register_module_forward_hook(
            self._on_post, with_kwargs=True, always_call=True
        )
        atexit.register(self.finish)

    # -- recording ------------------------------------------------------------------------
    def _on_pre(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        depth = self._local.depth
        self._local.depth = depth + 1
        if self._replaying or depth:
            return
        if self._root is None and next(module.parameters(), None) is not None:
            self._root = module
            self._names = {id(m): ("root." + n if n else "root") for n, m in module.named_modules()}
        if module is self._root:
            self.token += 1

    def _on_post(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        self._local.depth = max(0, self._local.depth - 1)
        if self._replaying:
            return
        # the operator's first input: positional, or its first keyword (``norm(hidden_states=x)``)
        x = args[0] if args else next(iter(kwargs.values()), None) if kwargs else None
        if not isinstance(x, torch.Tensor):
            return
        try:
            self._record(module, x)
        except Exception as exc:  # never break the user's program
            self._replaying = True
            print(
                f"layerwatch: replay recording stopped: {type(exc).__name__}: {exc}",
                file=sys.stderr,
            )

    def _plan(self, module: torch.nn.Module) -> tuple[Any, str, dict[str, Any], str]:
        from layerwatch.engine.precheck import plan_for

        cached = self._plans.get(id(module))
        if cached is not None and cached[-1] is module:
            return cached[:-1]
        name = self._names.get(id(module), type(module).__name__)
        cls, attrs = module_class(module), module_attrs(module)
        plan = plan_for(Node(name, type(module).__name__, cls=cls, attrs=attrs), "", {})
        self._plans[id(module)] = (plan, cls, attrs, name, module)
        return plan, cls, attrs, name

    def _record(self, module: torch.nn.Module, x: torch.Tensor) -> None:
        plan, cls, attrs, name = self._plan(module)
        if isinstance(plan, str):
            with self._lock:
                self.unsupported[plan] = self.unsupported.get(plan, 0) + 1
            return
        forward = module.__dict__.get("forward", type(module).forward)
        params = tuple(
            (n, tuple(p.shape), str(p.dtype)) for n, p in module.named_parameters(recurse=False)
        )
        key = (
            cls,
            json.dumps(attrs, sort_keys=True, default=str),
            tuple(x.shape),
            str(x.dtype),
            params,
            getattr(forward, "__qualname__", ""),
            id(getattr(forward, "__code__", forward)),
        )
        with self._lock:
            op = self.ops.get(key)
            if op is None:
                op = self.ops[key] = OpStats(
                    name, cls, attrs, module, max(self.token, 0), tuple(x.shape), x.dtype
                )
        op.add(x)

    # -- replay ---------------------------------------------------------------------------
    def finish(self) -> None:
        """Replay every distinct operator and write the results (called once, at exit)."""
        if self._replaying:
            return
        self._replaying = True
        self._pre.remove()
        self._post.remove()
        try:
            rows = [replay_one(op, i) for i, op in enumerate(self.ops.values())]
            body = {
                "format": FORMAT,
                "version": VERSION,
                "pid": os.getpid(),
                "tokens": self.token + 1,
                "calls": sum(op.calls for op in self.ops.values()),
                "rows": rows,
                "unsupported": dict(sorted(self.unsupported.items())),
            }
            path = self.out / f"replay_{os.getpid()}.json"
            self.out.mkdir(parents=True, exist_ok=True)
            with replacing(path) as tmp:
                text = json.dumps(_compact(body), allow_nan=False, separators=(",", ":"))
                tmp.write_text(text, encoding="utf-8")
        except Exception as exc:
            print(f"layerwatch: replay failed: {type(exc).__name__}: {exc}", file=sys.stderr)


def _compact(value: Any) -> Any:
    """Floats to 6 significant digits: the report's figures, at a third of the bytes."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _compact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_compact(v) for v in value]
    return value


def random_input(op: OpStats, seed: int, device: torch.device) -> torch.Tensor:
    """Values of ``op``'s recorded shape and dtype drawn to match its recorded range."""
    gen = torch.Generator().manual_seed(seed)
    if not op.dtype.is_floating_point:
        lo, hi = int(op.lo), int(op.hi)
        x = torch.randint(lo, hi + 1, op.shape, generator=gen, dtype=torch.int64)
        return x.to(device=device, dtype=op.dtype)
    std = op.std if op.std > 0 else max(abs(op.mean), 1.0) * 1e-3
    x = torch.randn(op.shape, generator=gen, dtype=torch.float64) * std + op.mean
    if math.isfinite(op.lo) and math.isfinite(op.hi):
        x = x.clamp(op.lo, op.hi)
    return x.to(device=device, dtype=op.dtype)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _numpy64(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    if t.is_floating_point():
        return t.double().numpy()
    return t.long().numpy()


def replay_one(op: OpStats, index: int) -> dict[str, Any]:
    """Call ``op``'s module on random inputs and judge the output against float64."""
    from layerwatch.engine.precheck import plan_for

    op.settle()
    row: dict[str, Any] = {
        "node": op.node,
        "class": op.cls,
        "type": op.cls.rsplit(".", 1)[-1],
        "token": op.token,
        "shape": list(op.shape),
        "dtype": _dtype_name(op.dtype),
        "calls": op.calls,
        "ranges": op.ranges(),
        "verdict": "error",
        "metrics": {},
        "reason": "",
    }
    if op.count == 0:
        row["reason"] = "no finite input values recorded"
        return row
    module = op.module
    param = next(module.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    try:
        x = random_input(op, SEED + index, device)
        with torch.no_grad():
            out = module(x)
        if isinstance(out, tuple | list):
            out = out[0]
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"the operator returned a {type(out).__name__}")
        plan = plan_for(Node(op.node, row["type"], cls=op.cls, attrs=op.attrs), "", {})
        if isinstance(plan, str):
            raise ValueError(f"no reference for {plan}")
        params = {f"{op.node}.{n}": p for n, p in module.named_parameters(recurse=False)}

        def get(name: str) -> np.ndarray:
            if name == "input_0":
                return _numpy64(x)
            if name in params:
                return _numpy64(params[name])
            raise KeyError(f"{name} is not an input or parameter of the operator")

        def dtype_of(name: str) -> str:
            p = params.get(name)
            return _dtype_name(p.dtype) if p is not None else "float32"

        get.dtype_of = dtype_of  # type: ignore[attr-defined]
        check = ref.judge(_numpy64(out), plan(get), _dtype_name(out.dtype))
    except Exception as exc:
        row["reason"] = f"cannot replay: {type(exc).__name__}: {str(exc)[:200]}"
        return row
    row["verdict"] = "pass" if check.ok else "fail"
    row["metrics"] = {k: (v if math.isfinite(v) else None) for k, v in check.metrics.items()}
    row["reason"] = check.reason
    return row
