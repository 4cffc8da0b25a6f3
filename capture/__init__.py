"""Produce tensors: hooks in the model process, dump writers, the launcher and the watchers.

Drop-in for msit users: ``DumpConfig``, ``register_hook(model, config)`` and ``seed_all(seed)``
keep msit's names and meanings. Exports are lazy (PEP 562) so that importing a light submodule
(``format``, ``arrivals``, ``watch``) never pulls in torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cases import case
    from .config import DumpConfig
    from .hooks import HookHandle, register_hook
    from .seed import seed_all

__all__ = ["DumpConfig", "HookHandle", "case", "register_hook", "seed_all"]

_EXPORTS = {
    "DumpConfig": "config",
    "case": "cases",
    "HookHandle": "hooks",
    "register_hook": "hooks",
    "seed_all": "seed",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'layerwatch.capture' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{module}", __name__), name)
