"""Compiled dataclass methods kept between runs of the ``layerwatch`` command.

A ``@dataclass`` writes its ``__init__``, ``__repr__``, ``__eq__`` (and, frozen, ``__setattr__``
and ``__delattr__``; ordered, four comparisons) as source text and compiles each with ``exec``
when its module is imported. A compare of msit dumps imports 42 dataclasses, 201 such compiles:
~60 % of their ~25 ms creation cost, ~8 % of the whole process on bench case (b)
(tests/bench/bench_compare.py). The text is a pure function of the class (its field names,
defaults, options) and compiling it is a pure function of the text, so the code objects are
kept, keyed by their text, in one ``marshal`` file beside this module's byte code
(``__pycache__``, where Python keeps ``.pyc`` files, not written under
``PYTHONDONTWRITEBYTECODE`` either) and executed in the class's own namespaces exactly as
dataclasses would: the functions made are the same. Text not in the file is compiled as
dataclasses compiles it (``compile``, ``"<string>"``, no inherited ``__future__`` flags: the
dataclasses module has none) and the file is rewritten once, at the end of the command.

Only the process entry installs it (``tui/cli.py`` ``main()`` without ``argv``); the hook is
the ``exec`` name in the dataclasses module's globals, which its method builder looks up (Python
3.10–3.13); another Python keeps compiling as before.
"""

from __future__ import annotations

import builtins
import marshal
import os
import sys
from typing import Any

LIMIT = 4096
"""More texts than this (many versions' classes): the file keeps only this run's."""

_EXEC = builtins.exec


class MethodCache:
    """The texts → code objects of one file; :meth:`exec_source` stands in for ``exec``."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.codes: dict[str, Any] = {}
        self.used: set[str] = set()
        self.new = 0
        """Texts compiled in this process (the file is rewritten when there are any)."""
        if path is not None:
            self.codes = _read(path)

    def exec_source(
        self, source: Any, namespace: Any = None, local: Any = None, /, *args: Any, **kw: Any
    ) -> None:
        """``exec`` with a string's compile taken from (or kept in) the cache; any other call
        (code objects, more arguments) passes through."""
        if source.__class__ is str and not args and not kw:
            code = self.codes.get(source)
            if code is None:
                code = self.codes[source] = compile(source, "<string>", "exec", dont_inherit=True)
                self.new += 1
            self.used.add(source)
            source = code
        _EXEC(source, namespace, local, *args, **kw)

    def save(self) -> None:
        """Rewrite the file when this run compiled something (atomically: a concurrent run
        reads the old file or the new one); an unwritable place is left as it is."""
        if not self.new or self.path is None or sys.dont_write_bytecode:
            return
        codes = self.codes
        if len(codes) > LIMIT:
            codes = {text: codes[text] for text in self.used}
        from layerwatch.capture.atomic import replacing

        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with replacing(self.path, unique=True) as tmp, open(tmp, "wb") as fh:
                fh.write(marshal.dumps((_stamp(), codes)))
        except (OSError, ValueError):
            return
        self.new = 0


def _stamp() -> str:
    """What the code objects depend on besides their text: the interpreter (byte code and
    ``marshal`` format) and ``-O``."""
    return f"{sys.version}|{sys.implementation.cache_tag}|{sys.flags.optimize}"


def _read(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            stamp, codes = marshal.loads(fh.read())
    except (OSError, EOFError, ValueError, TypeError):
        return {}
    if stamp != _stamp() or not isinstance(codes, dict):
        return {}
    return codes


def default_path(command: str) -> str | None:
    """The file of ``command``'s classes beside this module's byte code (a file a command: the
    TUI's Textual classes outnumber a compare's ten to one, and a compare would read them all),
    None where there is no byte code (no ``__cached__``)."""
    cached = globals().get("__cached__")
    if not cached:
        return None
    tag = sys.implementation.cache_tag or "python"
    return os.path.join(os.path.dirname(cached), f"dataclass-methods.{command}.{tag}.marshal")


def install(path: str | None) -> MethodCache:
    """Route the dataclasses module's method compiles through the cache kept in ``path``
    (None: compiled, not kept)."""
    import dataclasses

    cache = MethodCache(path)
    dataclasses.exec = cache.exec_source  # type: ignore[attr-defined]
    return cache


def uninstall() -> None:
    """Back to the built-in ``exec`` (tests)."""
    import dataclasses

    dataclasses.__dict__.pop("exec", None)
