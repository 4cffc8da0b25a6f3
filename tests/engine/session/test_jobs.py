"""engine.jobs: shares per process, results independent of --jobs, a pool that cannot start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.records import COSINE, TensorRecord
from layerwatch.engine.session.forked import Forked, can_fork
from layerwatch.engine.session.jobs import JobRunner, Work
from support.toy_model import ToyRun


def _works(golden: ToyRun, target: ToyRun) -> list[Work]:
    by_key = {r.key: r for r in target.records}
    return [Work(r, by_key[r.key], False) for r in golden.records if r.key in by_key]


def test_shares_cover_every_pair_once_balanced_by_cost(toy_runs: dict[str, ToyRun]) -> None:
    work = _works(toy_runs["golden"], toy_runs["faulty"])
    runner = JobRunner(lambda *a, **k: None, None, jobs=3)
    assert runner.plan(work) == ([], list(range(len(work))))  # the toy does not pay for it
    runner.MIN_PARALLEL_COST = 0.0  # as if it did
    tasks, inline = runner.plan(work)
    assert len(work) >= 256 and len(tasks) == 2
    shares = [inline, *tasks]
    assert sorted(i for s in shares for i in s) == list(range(len(work)))
    sizes = [sum(work[i].nbytes for i in s) for s in shares]
    assert max(sizes) < 1.5 * min(sizes)


def _key_metrics(results: list) -> list[tuple[object, ...]]:
    return [(r.key, r.verdict.value, r.metrics, r.golden_stats, r.target_stats) for r in results]


def test_results_do_not_depend_on_jobs(toy_runs: dict[str, ToyRun]) -> None:
    from layerwatch.engine.numerics.compare import compare_pair
    from layerwatch.engine.numerics.thresholds import Thresholds

    work = _works(toy_runs["golden"], toy_runs["faulty"])
    th = Thresholds.default()
    first = JobRunner(compare_pair, th, jobs=1)
    first.side_stats = True
    one = first.run(work)
    assert all(r.golden_stats is not None for r in one)  # the toy's records carry none
    for compare in (compare_pair, compare_noting_pid):
        runner = JobRunner(compare, th, jobs=2)
        runner.side_stats = True
        runner.MIN_PARALLEL_COST = 0.0  # the toy is too small to pay for a second process
        try:
            two = runner.run(work)
        finally:
            runner.close()
        assert _key_metrics(two) == _key_metrics(one)  # bit-identical metrics
        assert all(isinstance(r.golden, TensorRecord) for r in two)  # records re-attached
        assert any(r.metrics[COSINE] < 0.999 for r in two)
    assert len({r.node_type for r in two}) == 2  # a share really ran in another process


def compare_noting_pid(golden, target, thresholds, *, is_logits=False, side_stats=False):
    """compare_pair, one pair at a time, noting which process compared the pair."""
    from layerwatch.engine.numerics.compare import compare_pair

    result = compare_pair(golden, target, thresholds, is_logits=is_logits, side_stats=side_stats)
    result.node_type = str(os.getpid())
    return result


SWAPPED_STDERR = """
import io, json, pathlib, sys, threading
from layerwatch.engine.session.core import CompareSession
from support.toy_model import ToyModel

class Swapped(io.StringIO):  # what Textual puts in sys.stderr while the app runs
    def fileno(self):
        return -1

toy = ToyModel()
base = pathlib.Path(sys.argv[1])
golden, target = toy.run(base / "g"), toy.run(base / "t")
stop = threading.Event()
threading.Thread(target=stop.wait).start()  # another thread: the pool would use forkserver
sys.stderr = Swapped()
session = CompareSession(jobs=2)
session.runner.MIN_PARALLEL_COST = 0.0  # the toy is too small to pay for a pool otherwise
for side, run in (("golden", golden), ("target", target)):
    session.add_update(side, run.update())
    session.finish(side)
session.flush()
session.close()
stop.set()
print(json.dumps({"pairs": session.summary.pairs, "pass": session.summary.passed,
                  "notes": session.notes, "pool": session.runner._pool is not None}))
"""


def test_a_pool_that_cannot_start_compares_inline_with_a_note(tmp_path: Path) -> None:
    """The real failure: forkserver/resource tracker refuse a stderr whose fileno() is -1."""
    script = tmp_path / "swapped.py"
    script.write_text(textwrap.dedent(SWAPPED_STDERR))
    tests = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(tests), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["pairs"] >= 256 and report["pass"] == report["pairs"]
    notes = [n for n in report["notes"] if "no worker processes" in n]
    assert len(notes) == 1 and "\n" not in notes[0], report["notes"]
    assert not report["pool"]


def _boom(message: str) -> None:
    raise LayerwatchError(message)


def _die() -> None:
    os.kill(os.getpid(), 9)


def test_forked_child_returns_raises_or_reports_its_death() -> None:
    if not can_fork():
        pytest.skip("fork is used only on Linux with a single thread")
    parent = os.getpid()
    assert Forked(os.getpid).result() != parent  # really another process
    big = Forked(bytes, 1 << 20)  # more than a pipe holds: read while the child writes
    assert big.result() == bytes(1 << 20)
    with pytest.raises(LayerwatchError, match="bad dump"):
        Forked(_boom, "bad dump").result()
    with pytest.raises(ChildProcessError, match="signal 9"):
        Forked(_die).result()


def test_with_other_threads_the_pool_compares_the_shares(toy_runs: dict[str, ToyRun]) -> None:
    """Fork is unsafe once other threads run (the live pipeline, the TUI): a process pool then."""
    import threading

    from layerwatch.engine.numerics.compare import compare_pair
    from layerwatch.engine.numerics.thresholds import Thresholds

    work = _works(toy_runs["golden"], toy_runs["faulty"])
    th = Thresholds.default()
    one = JobRunner(compare_pair, th, jobs=1).run(work)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    runner = JobRunner(compare_pair, th, jobs=2)
    runner.MIN_PARALLEL_COST = 0.0
    try:
        assert not can_fork()
        two = runner.run(work)
        assert runner._pool is not None and runner.shares_elsewhere == 1
    finally:
        stop.set()
        other.join()
        runner.close()
    assert _key_metrics(two) == _key_metrics(one)


BLAS_PROBE = """
import json, os, sys
import numpy
from layerwatch.engine.numerics.blas import blas_threads
before = blas_threads()
import layerwatch.engine.numerics.compare
print(json.dumps({"before": before, "after": blas_threads(),
                  "env": os.environ.get("OPENBLAS_NUM_THREADS")}))
"""


def test_the_engine_runs_numpys_openblas_single_threaded() -> None:
    """Spinning BLAS threads fought the compare processes for the cores (--jobs 0 took 2.6-17 s
    instead of 0.6 s on 2 cores); the setting is process-local (nothing inherited)."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    out = subprocess.run(
        [sys.executable, "-c", BLAS_PROBE], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    probe = json.loads(out.stdout)
    if probe["before"] is None:
        pytest.skip("numpy without a bundled OpenBLAS")
    assert probe["before"] >= 1 and probe["after"] == 1
    assert probe["env"] is None  # not put in the environment of later subprocesses


def test_compare_command_defaults_blas_threads_to_one_before_numpy() -> None:
    code = (
        "import os; from layerwatch.engine.numerics.blas import env_before_numpy; env_before_numpy(); "
        "print(os.environ['OPENBLAS_NUM_THREADS'], os.environ['OMP_NUM_THREADS'])"
    )
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.split() == ["1", "1"], out.stderr
    env["OMP_NUM_THREADS"] = "3"  # a user's explicit choice stays
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.split() == ["1", "3"], out.stderr
