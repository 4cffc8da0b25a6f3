"""The TUI's architecture rules, each held by a test (ARCHITECTURE.md points here)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from layerwatch.tui import keys
from layerwatch.tui.app import LayerwatchApp
from layerwatch.tui.grid import LayerGrid
from layerwatch.tui.screens.block import BlockScreen
from layerwatch.tui.screens.main import MainScreen
from layerwatch.tui.screens.operator import OperatorScreen
from textual.message import Message

TUI = Path(__file__).resolve().parents[2] / "tui"


def _loaded(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_the_grid_model_imports_no_textual() -> None:
    """grid_model and palette are plain numpy: unit-tested and benchmarked without an app."""
    loaded = _loaded("import layerwatch.tui.grid_model")
    assert not {m for m in loaded if m == "textual" or m.startswith("textual.")}


def test_the_app_does_no_numerics_and_needs_no_torch() -> None:
    """The TUI is a view: metrics, thresholds and tensor loading stay in the engine."""
    loaded = _loaded("import layerwatch.tui.app, layerwatch.tui.screens.operator")
    for module in (
        "torch",
        "pandas",
        "layerwatch.engine.numerics.metrics",
        "layerwatch.engine.numerics.compare",
        "layerwatch.engine.readers.load",
        "layerwatch.engine.numerics.thresholds",
    ):
        assert module not in loaded, module


def test_every_custom_message_lives_in_messages_py() -> None:
    names = {
        n
        for n, v in vars(__import__("layerwatch.tui.messages", fromlist=["x"])).items()
        if isinstance(v, type) and issubclass(v, Message) and v is not Message
    }
    assert names >= {
        "CursorMoved",
        "CellChosen",
        "CellPairsLoaded",
        "DetailLoaded",
        "ExportFinished",
    }
    for path in TUI.rglob("*.py"):
        if path.name == "messages.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {getattr(b, "id", getattr(b, "attr", "")) for b in node.bases}
                assert "Message" not in bases, f"{path.name}: {node.name} belongs in messages.py"


@pytest.mark.parametrize(
    ("owner", "scope"),
    [
        (LayerGrid, "grid"),
        (MainScreen, "main"),
        (BlockScreen, "block"),
        (OperatorScreen, "operator"),
        (LayerwatchApp, "app"),
    ],
)
def test_bindings_come_from_the_action_registry(owner: type, scope: str) -> None:
    """One registry drives bindings, the Footer, the palette and the help screen."""
    bound = {(b.key, b.action) for b in owner.BINDINGS}
    registered = {(a.keys, a.name) for a in keys.actions(scope)}
    assert bound == registered
    for action in keys.actions(scope):
        assert callable(getattr(owner, f"action_{action.name}", None)), action.name


FORBIDDEN_IN_THREADS = {
    "query_one",
    "query",
    "update",
    "refresh",
    "notify",
    "mount",
    "push_screen",
    "pop_screen",
    "move_cursor",
    "focus",
    "remove",
    "set_text",
    "show",
}


def test_thread_workers_only_post_messages() -> None:
    """No thread touches a widget: ``@work(thread=True)`` bodies call the engine and post."""
    found = 0
    for path in TUI.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            threaded = any(
                isinstance(d, ast.Call)
                and getattr(d.func, "id", "") == "work"
                and any(k.arg == "thread" and getattr(k.value, "value", False) for k in d.keywords)
                for d in node.decorator_list
            )
            if not threaded:
                continue
            found += 1
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
                    assert call.func.attr not in FORBIDDEN_IN_THREADS, (
                        f"{path.name}:{node.name} calls {call.func.attr}"
                    )
    assert found >= 4  # cell pairs, block, explain, export
