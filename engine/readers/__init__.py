"""Dump readers: layerwatch's own format, msit torch dumps, ATB ``.bin`` dumps, msprobe dumps.

``open_dump(path)`` detects the format from the path (a run dir, a rank dir, a token dir, an
``msit_dump_*`` dir, a ``step*`` dir...) and returns an incremental :class:`DumpReader`.
No torch import anywhere here: ``.pth`` files are parsed by :mod:`.pth`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from layerwatch.capture.errors import LayerwatchError

from .base import DumpReader, ReaderUpdate

FORMATS = ("layerwatch", "msit", "atb", "msprobe")

__all__ = ["FORMATS", "DumpReader", "ReaderUpdate", "detect", "open_dump"]


def detect(path: str | os.PathLike[str]) -> str | None:
    """The format of the dump at ``path``, or ``None`` when nothing readable is there (yet)."""
    from . import atb, layerwatch, msit, msprobe

    p = Path(os.path.abspath(path))
    if p.is_file():
        return "msprobe" if p.name == msprobe.DUMP else None
    if not p.is_dir():
        return None
    if layerwatch.detect(p):
        return "layerwatch"
    if msprobe.locate(p) is not None:
        return "msprobe"
    if msit.locate(p) is not None:
        return "msit"
    if atb.locate(p) is not None:
        return "atb"
    return None


def open_dump(
    path: str | os.PathLike[str], side: str = "golden", *, fmt: str | None = None, **options: Any
) -> DumpReader:
    """A reader for the dump at ``path`` (format auto-detected unless ``fmt`` is given).

    ``options`` go to the reader (``nd_shapes=`` for ATB FRACTAL_NZ tensors). Raises
    :class:`LayerwatchError` with one line for a missing path or an unrecognised directory.
    """
    from .atb import AtbReader
    from .layerwatch import LayerwatchReader
    from .msit import MsitReader
    from .msprobe import MsprobeReader

    p = Path(os.path.abspath(path))
    if not p.exists():
        raise LayerwatchError(f"{path}: no such directory")
    kind = fmt or detect(p)
    if kind is None:
        raise LayerwatchError(
            f"{path} is not a dump layerwatch can read: expected a layerwatch dump (index.jsonl), "
            "an msit torch dump (model_tree.json, torch_tensors/), an ATB dump (tensors/) "
            "or an msprobe dump (dump.json)"
        )
    readers = {"layerwatch": LayerwatchReader, "msit": MsitReader, "atb": AtbReader}
    readers["msprobe"] = MsprobeReader
    if kind not in readers:
        raise LayerwatchError(f"unknown dump format {kind!r}: use one of {', '.join(FORMATS)}")
    try:
        reader = readers[kind](p, **options)
    except (TypeError, OSError) as exc:
        raise LayerwatchError(f"{path}: cannot open as a {kind} dump ({exc})") from None
    reader.side = side  # type: ignore[attr-defined]
    return reader
