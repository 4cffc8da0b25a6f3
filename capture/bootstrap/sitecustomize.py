"""layerwatch's capture bootstrap, loaded by ``site`` in every Python process of a launched job.

``layerwatch dump`` puts the directory holding only this file first on ``PYTHONPATH`` and the
settings (JSON) in ``LAYERWATCH_CAPTURE``. At start-up this module:

1. takes its own directory off ``sys.path`` again, so the program sees the path it would have;
2. arms a one-shot import hook for ``torch`` and imports nothing else, so a process that never
   imports torch pays next to nothing (measured: see the live notes);
3. runs the ``sitecustomize`` that would have run without us (the next one on ``sys.path``).

When ``import torch`` completes, the hook loads ``layerwatch.capture.autohook`` (from the
installation that launched the job if this interpreter cannot import layerwatch itself), which
waits for the root model's first forward call. Any failure prints one line on stderr and leaves
the program running as if nothing had happened.
"""

from __future__ import annotations

import importlib.machinery  # loaded by site before this file runs: costs nothing
import os
import sys

_ENV = "LAYERWATCH_CAPTURE"
_HERE = os.path.dirname(os.path.abspath(__file__))


def _unlist_self() -> None:
    sys.path[:] = [p for p in sys.path if not (p and os.path.abspath(p) == _HERE)]


def _on_torch() -> None:
    try:
        import json

        settings = json.loads(os.environ[_ENV])
        try:
            from layerwatch.capture import autohook
        except ImportError as exc:
            if not (exc.name or "").startswith("layerwatch"):
                raise
            sys.meta_path.append(_CaptureFinder(settings["capture_pkg"]))
            from layerwatch.capture import autohook
        autohook.install(settings)
    except Exception as exc:
        sys.stderr.write(f"layerwatch: capture disabled: {type(exc).__name__}: {exc}\n")


class _TorchTrigger:
    """A meta-path finder that answers nothing but notices ``import torch`` (once): it wraps
    the real loader's ``exec_module`` so that :func:`_on_torch` runs right after it."""

    def find_spec(
        self, name: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != "torch":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module: object) -> None:
            if "exec_module" in vars(loader):
                del loader.exec_module  # back to the class's method: leave no trace
            original(module)
            _on_torch()

        try:
            loader.exec_module = exec_module
        except AttributeError:
            sys.stderr.write("layerwatch: capture disabled: cannot hook this torch's loader\n")
        return spec


class _CaptureFinder:
    """Lets an interpreter without layerwatch installed import ``layerwatch.capture`` from the
    installation that launched it (only those names: nothing of the user's can be shadowed)."""

    def __init__(self, pkg_dir: str) -> None:
        self.pkg_dir = pkg_dir

    def find_spec(
        self, name: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        import importlib.machinery
        import importlib.util

        if name == "layerwatch":
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = []
            return spec
        if name == "layerwatch.capture":
            init = os.path.join(self.pkg_dir, "__init__.py")
            return importlib.util.spec_from_file_location(
                name, init, submodule_search_locations=[self.pkg_dir]
            )
        return None


def _chain() -> None:
    """Run the sitecustomize we displaced, as ``site`` would have (its errors are its own)."""
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
    if spec is None or spec.loader is None or not spec.origin:
        return
    if os.path.dirname(os.path.abspath(spec.origin)) == _HERE:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _boot() -> None:
    _unlist_self()
    if os.environ.get(_ENV) and "torch" not in sys.modules:
        sys.meta_path.insert(0, _TorchTrigger())
    _chain()


_boot()
