"""Compare in bounded memory: windows of tokens give the whole-run report byte for byte, the
result store keeps what a pair needs, a run too big for memory or stopped part-way ends cleanly.

Dumps are real layerwatch dumps written by capture's format code (tests/bench/bench_scale.py).
"""

from __future__ import annotations

import json
import math
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bench.bench_scale import measure, write_dump
from layerwatch.engine.outcome import ReportStream
from layerwatch.engine.readers import open_dump
from layerwatch.engine.records import PairResult, TensorKey, Verdict
from layerwatch.engine.session.budget import PAIR_BYTES, TOKEN_BYTES, Estimate
from layerwatch.engine.session.core import CompareSession
from layerwatch.engine.session.store import ResultStore
from layerwatch.engine.session.windowed import compare_windows

CLI = [sys.executable, "-m", "layerwatch.tui.cli"]


def _dumps(tmp: Path, tokens: int, tensors: int, **target: object) -> tuple[Path, Path]:
    write_dump(tmp / "golden" / "cpu_1", tokens, tensors, noise=0.0, seed=1)
    write_dump(tmp / "target" / "cpu_2", tokens, tensors, noise=1e-7, seed=2, **target)  # type: ignore[arg-type]
    return tmp / "golden", tmp / "target"


def _session() -> CompareSession:
    return CompareSession(jobs=1, side_stats=True)


def _readers(golden: Path, target: Path) -> dict[str, object]:
    return {"golden": open_dump(golden, side="golden"), "target": open_dump(target, side="target")}


@pytest.mark.parametrize("suffix", [".json", ".csv", ".jsonl"])
def test_windows_of_tokens_write_the_whole_run_report_byte_for_byte(
    tmp_path: Path, suffix: str
) -> None:
    golden, target = _dumps(tmp_path, 12, 40, faults=((3, 5), (6, 2)), diverge_at=9)
    whole = _session()
    for side, reader in _readers(golden, target).items():
        whole.add_update(side, reader.poll(None, final=True))  # type: ignore[attr-defined]
        whole.finish(side)
    whole.flush()
    one = ReportStream(tmp_path / f"whole{suffix}")
    one.add(whole.results())
    one.finish(whole)

    many = ReportStream(tmp_path / f"windowed{suffix}")
    run = compare_windows(_readers(golden, target), _session, many, window=50)  # type: ignore[arg-type]
    many.finish(run)

    assert run.rows == len(whole.results()) > 400
    assert run.summary == whole.summary
    assert run.summary.failed and run.summary.diverged  # the rules that cross windows ran
    assert run.first_failure is not None and run.first_failure.token == 3
    assert run.divergence == whole.divergence
    assert (tmp_path / f"windowed{suffix}").read_bytes() == (
        tmp_path / f"whole{suffix}"
    ).read_bytes()


def test_the_store_gives_back_each_row_and_pair(tmp_path: Path) -> None:
    golden, target = _dumps(tmp_path, 4, 40, faults=((1, 3),))
    session = _session()
    for side, reader in _readers(golden, target).items():
        session.add_update(side, reader.poll(None, final=True))  # type: ignore[attr-defined]
        session.finish(side)
    session.flush()
    results = session.results()
    store = ResultStore()
    store.append(results[:50])
    store.append(results[50:])
    assert len(store) == len(results)
    for i, result in enumerate(results):
        assert store.row(i) == result.to_json()
        back = store.result(i)
        assert (back.key, back.verdict, back.failed, back.order, back.block) == (
            result.key,
            result.verdict,
            result.failed,
            result.order,
            result.block,
        )
        assert back.golden is not None and result.golden is not None
        assert back.golden.loc == result.golden.loc  # enough to load it again
    odd = PairResult(
        TensorKey(0, "n", "output"),
        Verdict.ERROR,
        {"a": math.nan, "b": -0.0, "c": math.inf, "d": 1.0, "e": 0.0},
        reason="cannot read",
    )
    store.append([odd])
    back = store.result(len(store) - 1)
    assert math.isnan(back.metrics["a"]) and math.copysign(1, back.metrics["b"]) < 0
    assert back.metrics["c"] == math.inf and list(back.metrics) == list(odd.metrics)
    assert back.golden is None and back.target is None and back.reason == "cannot read"
    assert store.counts[Verdict.ERROR] == 1


def test_a_compare_too_big_for_memory_is_one_line_naming_the_filters(tmp_path: Path) -> None:
    """64 KB beside the window: the tokens whose tables fit in it (both indexes in token order:
    folded per token, ``PAIR_BYTES`` a pair)."""
    golden, target = _dumps(tmp_path, 20, 400)
    small = subprocess.run(
        [*CLI, "compare", str(golden), str(target), "--max-memory", "160.0625M"],
        capture_output=True,
        text=True,
    )
    assert small.returncode == 2, small.stderr
    line = small.stderr.strip()
    fit = (1 << 16) // (400 * PAIR_BYTES + TOKEN_BYTES)  # 7
    assert "\n" not in line and "8 000 pairs" in line and f"--tokens 0-{fit - 1} fits" in line, line
    assert "--nodes" in line
    fits = subprocess.run(
        [*CLI, "compare", str(golden), str(target), "--max-memory", "4G", "--nodes", "*.0.*"],
        capture_output=True,
        text=True,
    )
    assert fits.returncode in (0, 1), fits.stderr
    assert "pairs: 360 compared" in fits.stdout  # 20 tokens × 9 operators × 2 of layer 0
    bad = subprocess.run(
        [*CLI, "compare", str(golden), str(target), "--max-memory", "lots"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "8G" in bad.stderr


def test_a_compare_stopped_part_way_keeps_its_rows_marked_incomplete(tmp_path: Path) -> None:
    golden, target = _dumps(tmp_path, 60, 1000)
    report = tmp_path / "report.csv"
    proc = subprocess.Popen(
        [*CLI, "compare", str(golden), str(target), "-o", str(report), "--jobs", "1"],
        stderr=subprocess.PIPE,
        text=True,
    )
    partial = tmp_path / ".tmp-report.csv"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if partial.exists() and partial.stat().st_size > 4_000_000:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the compare ended before it could be stopped"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.splitlines() == [f"layerwatch compare: interrupted; {report} holds the rows so far"]
    assert report.exists(), err
    lines = report.read_text().splitlines()
    assert lines[-1].startswith("# incomplete: stopped by the user after "), lines[-1]
    rows = int(lines[-1].split("after ")[1].split()[0])
    assert rows == len(lines) - 2 and 0 < rows < 60_000  # header, rows, the mark
    assert [int(line.split(",")[1]) for line in lines[1:-1]] == list(range(rows))
    assert not partial.exists()


def test_memory_a_pair_stays_within_the_budget_of_the_estimate(tmp_path: Path) -> None:
    """CI smoke of tests/bench/bench_scale.py: ~50 k pairs, peak RSS above start-up within what
    the memory check assumes (engine/session/budget.py: the window, token tables and both
    indexes folded per token; no store of the pairs), far below a whole-run session's 5 KB a pair. Bytes, never
    seconds: CI machines are shared."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    got = measure(tmp_path, 50_000, tensors=1000)
    assert got["pairs"] >= 45_000
    pairs = int(got["pairs"])
    above = got["bytes_per_pair"] * pairs
    assert above <= Estimate(pairs, pairs // 1000, windowed=True, folded=True).nbytes, got
    assert got["bytes_per_pair"] < 2_500, got  # a whole-run session: ~5 400


def test_a_parquet_report_holds_the_json_rows_and_head(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    golden, target = _dumps(tmp_path, 6, 40, faults=((2, 4),))
    out = tmp_path / "report.parquet"
    done = subprocess.run(
        [*CLI, "compare", str(golden), str(target), "-o", str(out), "--json"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    table = pq.read_table(out).to_pylist()
    assert len(table) == len(report["rows"]) == 240
    for got, row in zip(table, report["rows"], strict=True):
        assert (got["token"], got["node"], got["tensor"], got["verdict"], got["reason"]) == (
            row["token"],
            row["node"],
            row["tensor"],
            row["verdict"],
            row["reason"],
        )
        assert {k: v for k, v in got.items() if k in row["metrics"]} == row["metrics"]
    head = json.loads(pq.read_metadata(out).metadata[b"layerwatch"])
    assert head["first_failure"] == report["first_failure"] and head["summary"]["fail"] >= 1


def test_a_full_disk_keeps_the_rows_written_marked_incomplete(tmp_path: Path) -> None:
    """A file-size limit stands in for a full disk: the write that fails is cut back out,
    the rows before it stay, the report says why it stops there; one line, exit 2."""
    golden, target = _dumps(tmp_path, 10, 2000)
    report = tmp_path / "report.csv"

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (3_000_000, 3_000_000))

    done = subprocess.run(
        [*CLI, "compare", str(golden), str(target), "-o", str(report), "--jobs", "1"],
        preexec_fn=limit,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "File too large" in done.stderr
    lines = report.read_text().splitlines()
    assert lines[-1].startswith("# incomplete: stopped after "), lines[-1]
    rows = int(lines[-1].split("after ")[1].split()[0])
    assert 0 < rows < 20_000 and rows == len(lines) - 2
    assert [int(line.split(",")[1]) for line in lines[1:-1]] == list(range(rows))
