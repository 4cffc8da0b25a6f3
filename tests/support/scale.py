"""A compare's report two ways, for tests of the windowed path (engine/session/windowed.py):
the whole-run session every format took before windows, and ``compare`` in small windows."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from layerwatch.engine.outcome import ReportStream
from layerwatch.engine.readers import open_dump
from layerwatch.engine.runner import _spread_ranks
from layerwatch.engine.session import windowed
from layerwatch.engine.session.core import CompareSession
from layerwatch.tui.cli import main


def whole_run_report(golden: Path, target: Path, out: Path) -> None:
    """The report as the whole-run path wrote it before windows: one session, every record."""
    updates = {
        side: open_dump(path, side=side).poll(None, final=True)
        for side, path in (("golden", golden), ("target", target))
    }
    _spread_ranks(updates, argparse.Namespace(target=str(target), map=None))  # + absent ranks
    session = CompareSession(jobs=1, side_stats=True)
    try:
        session.compare_finished(updates["golden"], updates["target"])
    finally:
        session.close()
    stream = ReportStream(out)
    stream.add(session.results())
    stream.finish(session)


def windowed_report(
    golden: Path, target: Path, out: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[int, int]:
    """``compare -o out`` in windows of about 7 tensors (a token or less each), indexes read
    4 KB at a time (so the ranks of a layerwatch dump are read at their own pace); (exit code,
    windows compared)."""
    monkeypatch.setattr(windowed, "WINDOW_TENSORS", 7)
    monkeypatch.setattr(windowed, "CHUNK_BYTES", 4096)
    count = [0]

    def counting(real: Callable[..., Iterator[dict]]) -> Callable[..., Iterator[dict]]:
        def counted(*args: object, **kwargs: object) -> Iterator[dict]:
            for window in real(*args, **kwargs):
                count[0] += 1
                yield window

        return counted

    # finished single-rank layerwatch dumps are cut from index columns, the rest by chunks
    monkeypatch.setattr(windowed, "windows", counting(windowed.windows))
    monkeypatch.setattr(windowed, "column_windows", counting(windowed.column_windows))
    code = main(["compare", str(golden), str(target), "-o", str(out), "--jobs", "1"])
    return code, count[0]
