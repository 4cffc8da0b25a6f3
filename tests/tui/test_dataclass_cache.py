"""tui/dataclass_cache.py: dataclass methods compiled once and kept make the same classes."""

from __future__ import annotations

import dataclasses
import inspect
import marshal
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from layerwatch.tui import dataclass_cache

MSIT = Path(__file__).resolve().parents[1] / "fixtures" / "msit"


@pytest.fixture
def restore_exec(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Byte code may be written (the file is kept as ``.pyc`` files are); ``exec`` restored."""
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    yield
    dataclasses_exec = dataclasses.__dict__.get("exec")
    dataclass_cache.uninstall()
    assert dataclasses_exec is None or "exec" not in dataclasses.__dict__


def _classes() -> list[type]:
    """One of each kind of method dataclasses writes: plain, frozen, ordered, defaults,
    factories, slots, keyword-only, ``InitVar`` and ``__post_init__``."""

    @dataclasses.dataclass
    class Plain:
        a: int
        b: str = "x"
        c: list[int] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True, slots=True, order=True)
    class Frozen:
        x: float
        y: tuple[int, ...] = ()

    @dataclasses.dataclass(kw_only=True)
    class Keywords:
        n: int
        scale: dataclasses.InitVar[float] = 1.0
        out: float = dataclasses.field(init=False, default=0.0)

        def __post_init__(self, scale: float) -> None:
            self.out = self.n * scale

    return [Plain, Frozen, Keywords]


def _behaviour(classes: list[type]) -> list[object]:
    plain, frozen, keywords = classes
    p = plain(1)
    f = frozen(2.0, (1, 2))
    k = keywords(n=3, scale=2.0)
    try:
        f.x = 5.0  # type: ignore[misc]
        refused = False
    except dataclasses.FrozenInstanceError:
        refused = True
    return [
        repr(p).split(".")[-1],
        p == plain(1, "x", []),
        p != plain(2),
        repr(f).split(".")[-1],
        f < frozen(3.0),
        f >= frozen(2.0, (1, 2)),
        hash(f) == hash(frozen(2.0, (1, 2))),
        refused,
        k.out,
        [str(inspect.signature(c)) for c in classes],
        [c.__init__.__annotations__ for c in classes],
        [c.__init__.__code__.co_code for c in classes],
        [c.__init__.__defaults__ for c in classes],
        [c.__init__.__kwdefaults__ for c in classes],
    ]


def test_classes_made_through_the_cache_are_those_made_without(
    tmp_path: Path, restore_exec: None
) -> None:
    """Compiled (first run), loaded from the file (second run) or without the cache: the same
    methods, annotations (no ``from __future__`` leaks into them), defaults and byte code."""
    plain = _behaviour(_classes())
    path = str(tmp_path / "methods.marshal")
    first = dataclass_cache.install(path)
    compiled = _behaviour(_classes())
    assert first.new >= 9  # three __init__, __repr__, __eq__; frozen and ordered methods
    first.save()
    assert os.path.exists(path) and first.new == 0
    second = dataclass_cache.install(path)
    loaded = _behaviour(_classes())
    assert second.new == 0 and second.used  # every text came from the file
    assert compiled == plain == loaded
    # the fields' own annotations (this module's are strings), not the generated code's names
    assert plain[9][0] == "(a: 'int', b: 'str' = 'x', c: 'list[int]' = <factory>) -> None"


def test_a_damaged_or_foreign_file_is_compiled_over(tmp_path: Path, restore_exec: None) -> None:
    """A truncated file, another interpreter's, or no file at all: the methods are compiled
    as without the cache, and the file rewritten whole."""
    path = tmp_path / "methods.marshal"
    plain = _behaviour(_classes())
    for content in (b"\x00garbage", marshal.dumps(("another python", {})), None):
        if content is not None:
            path.write_bytes(content)
        cache = dataclass_cache.install(str(path))
        assert _behaviour(_classes()) == plain
        assert cache.new > 0
        cache.save()
        assert dataclass_cache.MethodCache(str(path)).codes.keys() == cache.codes.keys()
        path.unlink()


def test_nothing_is_written_where_it_cannot_be(tmp_path: Path, restore_exec: None) -> None:
    """An unwritable place (a file where the folder should be) is no error: the classes are
    made all the same."""
    (tmp_path / "file").write_text("")
    cache = dataclass_cache.install(str(tmp_path / "file" / "methods.marshal"))
    plain = _behaviour(_classes())
    cache.save()
    assert cache.new > 0 and not (tmp_path / "file" / "methods.marshal").exists()
    assert _behaviour(_classes()) == plain


def test_a_compare_process_keeps_its_methods_and_prints_the_same(tmp_path: Path) -> None:
    """``layerwatch compare`` as a process writes its command's file once (not under
    ``PYTHONDONTWRITEBYTECODE``), then reads it: the same report either way."""
    path = dataclass_cache.default_path("compare")
    assert path is not None and path.endswith(".marshal") and "compare" in path
    cmd = [sys.executable, "-m", "layerwatch.tui", "compare"]
    cmd += [str(MSIT / side / "msit_dump_fixture") for side in ("golden", "target")]
    cmd += ["--json"]
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    saved = Path(path).read_bytes() if os.path.exists(path) else None
    try:
        if saved is not None:
            os.unlink(path)
        quiet = subprocess.run(cmd, capture_output=True, env=dict(env, PYTHONDONTWRITEBYTECODE="1"))
        assert not os.path.exists(path)
        first = subprocess.run(cmd, capture_output=True, env=env)
        assert os.path.exists(path)
        kept = Path(path).stat().st_mtime_ns
        second = subprocess.run(cmd, capture_output=True, env=env)
        assert Path(path).stat().st_mtime_ns == kept  # nothing new: not rewritten
    finally:
        if saved is not None:
            Path(path).write_bytes(saved)
    outs = {(p.returncode, p.stdout, p.stderr) for p in (quiet, first, second)}
    assert len(outs) == 1 and quiet.stdout.startswith(b'{"summary"')
