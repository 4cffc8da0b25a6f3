"""Import rules of the live parts (ARCHITECTURE.md): no Textual/Rich below the TUI, capture
never imports the engine, the launcher and watchers never import torch."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _loaded(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return set(done.stdout.split())


@pytest.mark.parametrize(
    "statement",
    [
        "import layerwatch.engine.live.pipeline, layerwatch.engine.live.side",
        "import layerwatch.capture.launch, layerwatch.capture.dumpcmd, layerwatch.capture.watch",
    ],
)
def test_no_textual_below_the_tui(statement: str) -> None:
    loaded = _loaded(statement)
    assert not {m for m in loaded if m.split(".")[0] in ("textual", "rich")}


def test_launcher_and_watchers_import_neither_engine_nor_torch() -> None:
    loaded = _loaded(
        "import layerwatch.capture.launch, layerwatch.capture.dumpcmd, layerwatch.capture.watch, "
        "layerwatch.capture.stability, layerwatch.capture.procs"
    )
    assert not {m for m in loaded if m.startswith("layerwatch.engine")}
    assert "torch" not in loaded and "numpy" not in loaded


def test_frontends_import_lazily() -> None:
    """``layerwatch run --help`` style imports stay light: the front ends load the engine,
    torch-free, only when a command runs."""
    loaded = _loaded("import layerwatch.tui.frontends")
    assert "torch" not in loaded and "textual" not in loaded
    assert not {m for m in loaded if m.startswith("layerwatch.engine")}
