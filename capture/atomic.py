"""Atomic file replacement: write a temp file beside the target, then ``os.replace`` it in.

Every file layerwatch writes that someone may read while it is being written (dump data files,
manifests, topology, msit ``.pth`` files, reports, the reader's ``.npy`` cache) goes through
:func:`replacing`, so a reader sees the old file or the whole new one, never half of either.
The temp file sits in the same directory (a rename across file systems is not atomic) and is
named ``.tmp-<name>`` so that watchers and readers skip it (``format.TMP_PREFIX``); it is removed
when the write fails, so a full disk leaves no temp behind. Plain data: no numpy, no torch, no
engine import (capture never imports the engine; the engine may import this).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

TMP_PREFIX = ".tmp-"
"""Names starting with this are temp files, never data (watchers and readers skip them)."""


def temp_path(path: Path, *, unique: bool = False) -> Path:
    """``.tmp-<name>`` beside ``path``; with ``unique``, ``.tmp-<pid>-<name>`` for a file that
    several processes may write at once (the last rename wins, each write stays whole)."""
    prefix = f"{TMP_PREFIX}{os.getpid()}-" if unique else TMP_PREFIX
    return path.with_name(prefix + path.name)


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str], *, unique: bool = False) -> Iterator[Path]:
    """Yield the temp path to write; when the block ends normally, rename it over ``path``.

    On any exception the temp file is removed and an ``OSError`` without a file name gets
    ``path`` as its name (so the one-line message names the file the user asked for).
    """
    target = Path(path)
    tmp = temp_path(target, unique=unique)
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename is None:
            exc.filename = str(target)
        raise


def write_text(path: str | os.PathLike[str], text: str, *, newline: str | None = None) -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically."""
    with replacing(path) as tmp, open(tmp, "w", encoding="utf-8", newline=newline) as fh:
        fh.write(text)
