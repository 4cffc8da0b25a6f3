"""Architecture rules that a test can hold (ARCHITECTURE.md points here)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _modules_after_import(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


@pytest.mark.parametrize(
    "statement",
    [
        "import layerwatch.engine",
        "import layerwatch.capture",
        "import layerwatch.engine.seam, layerwatch.engine.records",
        "import layerwatch.capture.format, layerwatch.capture.arrivals, layerwatch.capture.tokens",
    ],
)
def test_engine_and_capture_never_import_textual(statement: str) -> None:
    loaded = _modules_after_import(statement)
    assert not {m for m in loaded if m == "textual" or m.startswith("textual.")}
    assert "rich" not in loaded


def test_cli_help_imports_neither_torch_nor_textual() -> None:
    loaded = _modules_after_import("import layerwatch.tui.cli as c; c.build_parser().format_help()")
    assert "torch" not in loaded
    assert "textual" not in loaded
    assert "numpy" not in loaded


def test_cli_help_lists_every_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "layerwatch.tui", "--help"], capture_output=True, text=True, check=True
    )
    for command in ("demo", "dump", "run", "watch", "open", "compare"):
        assert command in out.stdout


def test_capture_never_imports_engine() -> None:
    loaded = _modules_after_import(
        "import layerwatch.capture, layerwatch.capture.format, layerwatch.capture.arrivals"
    )
    assert not {m for m in loaded if m.startswith("layerwatch.engine")}
