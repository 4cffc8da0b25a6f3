"""Windows cut from column-opened indexes give the report that byte-chunk windows give, byte
for byte: a real capture of a tiny Llama (a fault planted in the target) and a synthetic dump
with faults and a divergence (tests/bench/bench_scale.py's writer)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from bench.bench_scale import write_dump
from layerwatch.engine.outcome import ReportStream
from layerwatch.engine.readers import open_dump
from layerwatch.engine.readers.base import ReaderUpdate
from layerwatch.engine.session.column_windows import token_windows
from layerwatch.engine.session.core import CompareSession
from layerwatch.engine.session.windowed import WindowedRun, compare_windows

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


class _ByteChunks:
    """A reader seen only through ``poll_chunk``: the byte-chunk windows of windowed.py."""

    def __init__(self, reader: object) -> None:
        self.reader = reader

    def poll_chunk(self, limit: int) -> ReaderUpdate | None:
        return self.reader.poll_chunk(limit)  # type: ignore[attr-defined]

    def forget_before(self, token: int) -> None:
        self.reader.forget_before(token)  # type: ignore[attr-defined]


def _report(golden: Path, target: Path, out: Path, *, columns: bool, window: int) -> WindowedRun:
    readers = {
        "golden": open_dump(golden, side="golden"),
        "target": open_dump(target, side="target"),
    }
    if not columns:
        readers = {side: _ByteChunks(r) for side, r in readers.items()}  # type: ignore[misc]
    stream = ReportStream(out)
    run = compare_windows(
        readers,  # type: ignore[arg-type]
        lambda: CompareSession(jobs=1, side_stats=True),
        stream,
        window=window,
    )
    stream.finish(run)
    return run


def _same_reports(golden: Path, target: Path, tmp: Path, window: int) -> WindowedRun:
    for suffix in (".csv", ".json"):
        old = _report(golden, target, tmp / f"old{suffix}", columns=False, window=window)
        new = _report(golden, target, tmp / f"new{suffix}", columns=True, window=window)
        assert (tmp / f"new{suffix}").read_bytes() == (tmp / f"old{suffix}").read_bytes()
        assert new.summary == old.summary and new.rows == old.rows
        assert new.first_failure == old.first_failure and new.divergence == old.divergence
    return new


def test_a_synthetic_dump_gives_the_same_report(tmp_path: Path) -> None:
    golden, target = tmp_path / "golden", tmp_path / "target"
    write_dump(golden / "cpu_1", 14, 60, noise=0.0, seed=1)
    write_dump(target / "cpu_2", 14, 60, noise=1e-7, seed=2, faults=((4, 7),), diverge_at=11)
    run = _same_reports(golden, target, tmp_path, window=90)
    assert run.summary.failed and run.summary.diverged and run.rows == 14 * 60


@pytest.mark.slow
def test_a_real_capture_gives_the_same_report(tmp_path: Path) -> None:
    def capture(out: Path, noise: float) -> Path:
        subprocess.run(
            [sys.executable, str(FIXTURES / "lw_llama_dump.py"), str(out), "11,42,7,93", "12",
             "", str(noise)],
            check=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        return out

    golden = capture(tmp_path / "golden", 0.0)
    target = capture(tmp_path / "target", 50.0)
    run = _same_reports(golden, target, tmp_path, window=300)
    assert run.summary.failed and run.first_failure is not None
    assert run.rows > 3 * 300  # several windows


def test_windows_are_whole_tokens_of_enough_golden_tensors() -> None:
    golden = (np.arange(6), np.array([3, 3, 1, 1, 1, 4]))
    target = np.array([0, 7, 9])  # tokens only the target has still get a window
    assert token_windows(golden, target, 4) == [(0, 1), (2, 5), (7, 9)]
    assert token_windows(golden, np.zeros(0, np.int64), 100) == [(0, 5)]
    none = np.zeros(0, np.int64)
    assert token_windows((none, none), none, 4) == []
