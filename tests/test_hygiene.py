"""Architecture rules that a test can hold (ARCHITECTURE.md points here)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

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


_FIXTURES = Path(__file__).parent / "fixtures"
_READERS = ("layerwatch", "msit", "msprobe", "atb", "msit_manual")
_NEVER_IN_A_COMPARE = ("textual", "rich", "torch", "pandas", "pyarrow", "numba", "numpy.ma")


@pytest.mark.parametrize(
    ("dump", "reader"),
    [
        ("msit/golden", "msit"),
        ("msprobe/tensor_golden", "msprobe"),
        ("atb/msit_dump_fixture", "atb"),
    ],
)
def test_a_headless_compare_imports_only_what_it_uses(dump: str, reader: str) -> None:
    """Start-up is most of a compare of small dumps (tests/bench/bench_compare.py case (b)):
    a clean ``compare --json`` imports its own format's reader and none of the others, no
    Textual, torch, pandas, pyarrow, numba or numpy.ma, and not the drill-in records
    (engine/seam_detail.py)."""
    path = _FIXTURES / dump
    args = ["compare", str(path), str(path), "--json", "--jobs", "1"]
    loaded = _modules_after_import(
        "import io; from layerwatch.tui.cli import main; real = sys.stdout; "
        f"sys.stdout = out = io.StringIO(); rc = main({args!r}); sys.stdout = real; "
        "assert rc == 0 and out.getvalue().startswith('{'), rc"
    )
    readers = {r for r in _READERS if f"layerwatch.engine.readers.{r}" in loaded}
    assert readers == {reader}
    assert "layerwatch.engine.session.core" in loaded  # it did compare
    heavy = {
        m for m in loaded if m in _NEVER_IN_A_COMPARE or m.split(".")[0] in _NEVER_IN_A_COMPARE
    }
    assert not heavy
    assert "layerwatch.engine.seam_detail" not in loaded
    assert "layerwatch.tui.app" not in loaded


def test_cli_help_lists_every_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "layerwatch.tui", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    for command in ("demo", "dump", "run", "watch", "open", "compare"):
        assert command in out.stdout


def test_capture_never_imports_engine() -> None:
    loaded = _modules_after_import(
        "import layerwatch.capture, layerwatch.capture.format, layerwatch.capture.arrivals"
    )
    assert not {m for m in loaded if m.startswith("layerwatch.engine")}


# The TUI's views see the engine only through the seam (plain records and batches) and the
# engine's wording (engine/wording.py: the words for metrics, values, findings and runs are the
# same in the TUI and the headless reports, so they live below both; it imports only records
# and seam); only the modules that wire a comparison together (the CLI front ends) may
# build sessions and pipelines.
_WIRING = {"cli.py", "demo.py", "frontends.py", "__main__.py"}
_VIEW_MAY_IMPORT = {
    "layerwatch.engine.seam",
    "layerwatch.engine.records",
    "layerwatch.engine.report",
    "layerwatch.engine.wording",
}


def _engine_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.startswith("layerwatch.engine")
        ):
            names = (
                [node.module]
                if node.module != "layerwatch.engine"
                else [f"layerwatch.engine.{alias.name}" for alias in node.names]
            )
            found.update(names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("layerwatch.engine"))
    return found


def test_tui_views_reach_the_engine_only_through_the_seam() -> None:
    tui = Path(__file__).resolve().parents[1] / "tui"
    offenders = {}
    for path in sorted(tui.rglob("*.py")):
        if path.name in _WIRING:
            continue
        extra = _engine_imports(path) - _VIEW_MAY_IMPORT
        if extra:
            offenders[str(path.relative_to(tui))] = sorted(extra)
    assert not offenders, offenders
