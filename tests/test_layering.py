"""Import layering, read from the source (ARCHITECTURE.md's rules table points here).

The graph is built from the AST of every module under capture/, engine/ and tui/: module-level
and function-level imports alike (a lazy import is still a dependency), without the ones under
``if TYPE_CHECKING:`` (annotations only, never run). Edges go to the module an import names:
``from pkg import sub`` is an edge to ``pkg.sub`` when that is a module, else to ``pkg``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"capture": "layerwatch.capture", "engine": "layerwatch.engine", "tui": "layerwatch.tui"}


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name → (file, is a package's ``__init__``)."""
    found: dict[str, tuple[Path, bool]] = {}
    for folder, dotted in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            is_init = parts[-1] == "__init__"
            if is_init:
                parts = parts[:-1]
            found[".".join([dotted, *parts])] = (path, is_init)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield from _imports_in(other)
            continue
        yield from _imports_in(child)


def _imports_in(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
    yield from _imports(node)


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, (path, is_init) in modules.items():
        package = name if is_init else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    origin = ".".join(base + ([node.module] if node.module else []))
                else:
                    origin = node.module or ""
                targets = [
                    f"{origin}.{a.name}" if f"{origin}.{a.name}" in modules else origin
                    for a in node.names
                ]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    deps.add(target)
        graph[name] = deps
    return graph


GRAPH = _graph()


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules in order, the first repeated at the end), or ``None``."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_graph_sees_every_kind_of_import() -> None:
    # relative, absolute, function-level: each kind shows up as an edge
    assert "layerwatch.capture.errors" in GRAPH["layerwatch.capture.launch"]  # from .errors
    assert "layerwatch.engine.records" in GRAPH["layerwatch.engine.seam"]  # absolute
    # a function-level import is an edge; one under TYPE_CHECKING is not
    assert "layerwatch.tui.screens.help" in GRAPH["layerwatch.tui.app"]
    assert "layerwatch.tui.app" not in GRAPH["layerwatch.tui.screens.main"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles() -> None:
    cycle = _cycle(GRAPH)
    assert cycle is None, "import cycle: " + " → ".join(cycle or [])


ENGINE_PACKAGES = ("readers", "numerics", "session", "live")


def _layer(name: str) -> str:
    """``engine.readers``, ``engine.numerics``... for those packages' modules, else the name."""
    parts = name.split(".")
    if parts[1] == "engine" and len(parts) > 2 and parts[2] in ENGINE_PACKAGES:
        return "engine." + parts[2]
    return name


# What each engine layer may import from the engine besides itself. numerics measures records,
# so it streams their bytes through readers/load.py (a large compare's next payloads read ahead
# in a thread by readers/prefetch.py, with load's own functions) and fills seam's plain result
# records (MetricCheck, PairDetail); it never reaches the other readers, the session or the
# front ends. The readers may also ask engine/orjson_lazy.py (a leaf) for orjson.
_MAY_IMPORT = {
    "engine.readers": {"layerwatch.engine.records", "layerwatch.engine.orjson_lazy"},
    "engine.numerics": {
        "layerwatch.engine.records",
        "layerwatch.engine.seam",
        "layerwatch.engine.readers.load",
        "layerwatch.engine.readers.prefetch",
    },
    "layerwatch.engine.records": set(),
    "layerwatch.engine.orjson_lazy": set(),  # a leaf: when orjson is imported (the index decode)
    "layerwatch.engine.seam": {"layerwatch.engine.records", "layerwatch.engine.seam_detail"},
    "layerwatch.engine.seam_detail": {"layerwatch.engine.records"},
}


@pytest.mark.parametrize("layer", sorted(_MAY_IMPORT))
def test_engine_layers_import_only_what_is_below_them(layer: str) -> None:
    offenders = {
        name: sorted(
            dep
            for dep in deps
            if dep.startswith("layerwatch.engine")
            and _layer(dep) != layer
            and dep not in _MAY_IMPORT[layer]
        )
        for name, deps in GRAPH.items()
        if _layer(name) == layer
    }
    assert not {k: v for k, v in offenders.items() if v}, offenders


def test_the_session_reaches_no_front_end() -> None:
    """The session sits below the live pipeline and the front ends (runner, outcome, report)."""
    below = ("engine.session", "engine.numerics", "engine.readers")
    offenders = {
        name: sorted(
            dep
            for dep in deps
            if dep.startswith("layerwatch.engine")
            and _layer(dep) not in below
            and dep not in ("layerwatch.engine.records", "layerwatch.engine.seam")
        )
        for name, deps in GRAPH.items()
        if _layer(name) == "engine.session"
    }
    assert not {k: v for k, v in offenders.items() if v}, offenders
