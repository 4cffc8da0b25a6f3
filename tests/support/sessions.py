"""A finished comparison of two whole runs, as ``layerwatch compare`` makes one (for tests).

Used by the session and numerics tests (``tests/engine/session``, ``tests/engine/numerics``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from layerwatch.engine.readers import ReaderUpdate, open_dump
from layerwatch.engine.session.core import CompareSession


def finished_session(golden: ReaderUpdate, target: ReaderUpdate, **kwargs: Any) -> CompareSession:
    """Both runs added whole, both finished, one flush (``kwargs`` go to the session)."""
    session = CompareSession(**kwargs)
    session.add_update("golden", golden)
    session.add_update("target", target)
    session.finish("golden")
    session.finish("target")
    session.flush()
    return session


def compare_dumps(golden: Path, target: Path, **kwargs: Any) -> CompareSession:
    """:func:`finished_session` of two dumps on disk (any format ``open_dump`` reads)."""
    return finished_session(
        open_dump(golden, "golden").poll(), open_dump(target, "target").poll(), **kwargs
    )
