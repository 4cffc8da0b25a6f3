"""Produce tensors: hooks in the model process, dump writers, the launcher and the watchers.

Drop-in for msit users: ``DumpConfig``, ``register_hook(model, config)`` and ``seed_all(seed)``
keep msit's names and meanings, and so do the manual dump points ``dump_data``/``set_label``
(with ``dump_region`` to tag a region of code). Exports are lazy (PEP 562) so that importing a light submodule
(``format``, ``arrivals``, ``watch``) never pulls in torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cases import case
    from .config import DumpConfig
    from .hooks import HookHandle, register_hook
    from .manual import dump_data, dump_region, set_label
    from .seed import seed_all

__all__ = [
    "DumpConfig",
    "HookHandle",
    "case",
    "dump_data",
    "dump_region",
    "register_hook",
    "seed_all",
    "set_label",
]

_EXPORTS = {
    "DumpConfig": "config",
    "case": "cases",
    "HookHandle": "hooks",
    "register_hook": "hooks",
    "seed_all": "seed",
    "dump_data": "manual",
    "dump_region": "manual",
    "set_label": "manual",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'layerwatch.capture' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{module}", __name__), name)
