"""Dump readers: layerwatch's own format, msit torch dumps, ATB ``.bin`` dumps, msprobe dumps.

``open_dump(path)`` detects the format from the path (a run dir, a rank dir, a token dir, an
``msit_dump_*`` dir, a ``step*`` dir, msit's manual ``golden_tensor`` dir...) and returns an incremental :class:`DumpReader`.
The directory given to the dumper works too: our ``dump_path`` (rank dirs inside) and
msprobe's (``step*`` inside) are dumps themselves; msit's ``-o``/``DumpConfig(dump_path)``
holds one ``msit_dump_{timestamp}`` per run — with exactly one it is used, with several
:func:`resolve` refuses and lists them (comparing the wrong runs is worse than typing a name;
the live pipeline, which follows a dump being written, takes the newest instead).
No torch import anywhere here: ``.pth`` files are parsed by :mod:`.pth`.
The lowest engine layer: from the rest of the engine only ``records`` is imported
(``tests/test_layering.py``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from importlib import import_module
from pathlib import Path
from typing import Any

from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.readers.base import DumpReader, ReaderUpdate, scandir

FORMATS = ("layerwatch", "msit", "atb", "msprobe", "msit-manual")
MSIT_RUN_PREFIX = "msit_dump_"
"""msit names each run's directory ``msit_dump_{timestamp}`` inside the output directory."""
_LISTED = 4
"""Run names listed in the one-line message before "… (N in all)"."""

__all__ = ["FORMATS", "DumpReader", "ReaderUpdate", "detect", "msit_runs", "open_dump", "resolve"]


def detect(path: str | os.PathLike[str]) -> str | None:
    """The format of the dump at ``path`` (or of the only ``msit_dump_*`` run inside it), or
    ``None`` when nothing readable is there (yet)."""
    p = Path(os.path.abspath(path))
    found = _detect_here(p)
    if found is None and p.is_dir():
        runs = msit_runs(p)
        if len(runs) == 1:
            return _detect_here(runs[0])
    return found


def msit_runs(path: str | os.PathLike[str]) -> list[Path]:
    """The ``msit_dump_*`` directories right inside ``path`` that hold a dump, oldest first
    (their names end with the time msit started)."""
    runs = [
        Path(e.path)
        for e in scandir(path)
        if e.name.startswith(MSIT_RUN_PREFIX) and e.is_dir() and _detect_here(Path(e.path))
    ]
    return sorted(runs, key=lambda p: p.name)


def resolve(path: str | os.PathLike[str]) -> Path:
    """The dump a user means by ``path``: ``path`` itself, or the only ``msit_dump_*`` run in
    msit's output directory. Several runs there: :class:`LayerwatchError` listing them."""
    p = Path(os.path.abspath(path))
    if not p.is_dir() or _detect_here(p) is not None:
        return p
    runs = msit_runs(p)
    if len(runs) == 1:
        return runs[0]
    if len(runs) > 1:
        names = ", ".join(r.name for r in runs[-_LISTED:][::-1])
        more = f", … ({len(runs)} in all)" if len(runs) > _LISTED else ""
        raise LayerwatchError(
            f"{path} holds {len(runs)} msit dumps (newest first: {names}{more}): "
            "pass the one to compare"
        )
    return p


def _detect_here(p: Path) -> str | None:
    # the path tests only (engine/readers/locate.py): a compare imports only its own reader
    from layerwatch.engine.readers import locate

    if p.is_file():
        return "msprobe" if p.name == locate.DUMP else None
    if not p.is_dir():
        return None
    if locate.detect(p):
        return "layerwatch"
    if locate.locate_msprobe(p) is not None:
        return "msprobe"
    if locate.locate_msit(p) is not None:
        return "msit"
    if locate.locate_atb(p) is not None:
        return "atb"
    if locate.locate_manual(p) is not None:
        return "msit-manual"
    return None


_READERS = {
    "layerwatch": "layerwatch.engine.readers.layerwatch:LayerwatchReader",
    "msit": "layerwatch.engine.readers.msit:MsitReader",
    "atb": "layerwatch.engine.readers.atb:AtbReader",
    "msprobe": "layerwatch.engine.readers.msprobe:MsprobeReader",
    "msit-manual": "layerwatch.engine.readers.msit_manual:MsitManualReader",
}
"""Each format's reader, imported only for a dump of that format."""


def open_dump(
    path: str | os.PathLike[str], side: str = "golden", *, fmt: str | None = None, **options: Any
) -> DumpReader:
    """A reader for the dump at ``path`` (format auto-detected unless ``fmt`` is given).

    ``options`` go to the reader (``nd_shapes=`` for ATB FRACTAL_NZ tensors). Raises
    :class:`LayerwatchError` with one line for a missing path or an unrecognised directory.
    """
    p = Path(os.path.abspath(path))
    if not p.exists():
        raise LayerwatchError(f"{path}: no such directory")
    p = resolve(p)
    kind = fmt or detect(p)
    if kind is None:
        raise LayerwatchError(
            f"{path} is not a dump layerwatch can read: expected a layerwatch dump (index.jsonl), "
            "an msit torch dump (model_tree.json, torch_tensors/), an ATB dump (tensors/) "
            "or an msprobe dump (dump.json)"
        )
    if kind not in _READERS:
        raise LayerwatchError(f"unknown dump format {kind!r}: use one of {', '.join(FORMATS)}")
    module, name = _READERS[kind].split(":")
    make: Callable[..., DumpReader] = getattr(import_module(module), name)
    try:
        reader = make(p, **options)
    except (TypeError, OSError) as exc:
        raise LayerwatchError(f"{path}: cannot open as a {kind} dump ({exc})") from None
    reader.side = side  # type: ignore[attr-defined]
    return reader
