"""Zero-code capture inside a launched process: find the root model, capture it as
``register_hook`` does.

Loaded by the bootstrap (``bootstrap/sitecustomize.py``) the moment ``import torch`` finishes,
so a program that never imports torch never loads this. :func:`install` registers torch's
*global* module hooks (``register_module_forward_pre_hook`` and an always-called forward hook)
that only track how deep module calls are nested. The first module called with parameters while
no other module is running is the root model ("the outermost module"); at that moment — inside
its first forward call, which becomes token 0 — we call ``register_hook(root, config,
already_in_call=True, ...)`` and remove the global hooks, so later calls cost nothing extra.

``LAYERWATCH_ROOT=ClassName`` picks the root by class name instead (any depth): for programs
that call some other module first.
"""

from __future__ import annotations

import os
import sys
import threading
from types import FrameType
from typing import Any

import torch
from torch.nn.modules import module as torch_module

from .config import DumpConfig
from .seed import seed_all

ROOT_ENV = "LAYERWATCH_ROOT"

_active: AutoHook | None = None


def config_from_settings(settings: dict[str, Any]) -> DumpConfig:
    """The child's ``DumpConfig`` from the launcher's settings (``launch.CaptureOptions``)."""
    return DumpConfig(
        dump_path=settings["dump_path"],
        token_range=settings.get("token_range"),
        tensor_part=int(settings.get("tensor_part", 2)),
        layer_name=settings.get("layer_name"),
        dump_statistics_mode=int(settings.get("dump_statistics_mode", 2)),
        dump_last_logits=bool(settings.get("dump_last_logits", False)),
        format=settings.get("format") or "layerwatch",
        keep_tokens=settings.get("keep_tokens"),
        follow=settings.get("follow") or None,
        cases=settings.get("cases"),
        dump_weight=bool(settings.get("dump_weight", False)),
    )


def install(settings: dict[str, Any]) -> Any:
    """Seed if asked (before the program builds its model), then wait for the root's first call.

    ``settings["entry"]`` (``"module:function"``) hands the process to another installer
    instead of capture — the launcher's way to run a front end's own in-process part (e.g.
    ``precheck --replay``) through this same bootstrap; capture itself imports nothing of it."""
    global _active
    entry = settings.get("entry")
    if entry:
        from importlib import import_module

        if settings.get("seed") is not None:
            seed_all(int(settings["seed"]))
        module_name, _, func = str(entry).partition(":")
        return getattr(import_module(module_name), func)(settings)
    if _active is None:
        config = config_from_settings(settings)
        if settings.get("seed") is not None:
            seed_all(int(settings["seed"]))
        from .collectives import rank_info
        from .writer_process import prestart

        if rank_info() is None:  # a rank's capture writes in its own thread (capture/hooks.py)
            prestart(config)  # its start overlaps the program's imports (writer_process.py)
        _active = AutoHook(config, os.environ.get(ROOT_ENV) or None)
    return _active


def _has_params(module: torch.nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def _already_captured(module: torch.nn.Module) -> bool:
    """The program called ``register_hook`` on this model itself: do not capture it twice."""
    for hook in module._forward_pre_hooks.values():
        owner = getattr(hook, "__self__", None)
        if type(owner).__name__ == "Recorder" and type(owner).__module__.endswith(
            "capture.recorder"
        ):
            return True
    return False


def _call_kwargs(module: torch.nn.Module) -> dict[str, Any] | None:
    """The keyword arguments of the call now starting, read from torch's ``_call_impl`` frame
    (a global pre-hook only receives positional ones). ``None`` if this torch differs: the
    capture then reads them at the end of the call instead."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            return None
        local = frame.f_locals
        if local.get("self") is module and isinstance(local.get("kwargs"), dict):
            return local["kwargs"]
        frame = frame.f_back
    return None


class AutoHook:
    """The global hooks that wait for the root model, and the capture handle once found."""

    def __init__(self, config: DumpConfig, root_type: str | None = None) -> None:
        self.config = config
        self.root_type = root_type
        self.handle: Any = None
        self.root: torch.nn.Module | None = None
        self._local = threading.local()
        self._lock = threading.Lock()
        self._done = False
        self._pre = torch_module.register_module_forward_pre_hook(self._on_pre)
        self._post = torch_module.register_module_forward_hook(self._on_post, always_call=True)

    def remove(self) -> None:
        self._pre.remove()
        self._post.remove()

    def _on_pre(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if self._done:
            return
        if self.root_type is not None:
            if type(module).__name__ == self.root_type:
                self._attach(module, args)
        elif depth == 0 and _has_params(module):
            self._attach(module, args)

    def _on_post(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        self._local.depth = max(0, getattr(self._local, "depth", 1) - 1)

    def _attach(self, root: torch.nn.Module, args: tuple[Any, ...]) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        self.remove()  # safe here: torch iterates over a copy of the global hooks
        if _already_captured(root):
            return
        from .hooks import register_hook

        kwargs = _call_kwargs(root)
        try:
            self.root = root
            self.handle = register_hook(
                root, self.config, already_in_call=True,
                call_args=args if kwargs is not None else None, call_kwargs=kwargs,
            )  # fmt: skip
        except Exception as exc:  # never break the user's program
            print(f"layerwatch: capture disabled: {type(exc).__name__}: {exc}", file=sys.stderr)
