"""engine.jobs: shares per process, results independent of --jobs, a pool that cannot start."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.records import COSINE, TensorRecord, Verdict
from layerwatch.engine.session import jobs
from layerwatch.engine.session.forked import Forked, UnitQueue, can_fork
from layerwatch.engine.session.jobs import JobRunner, Work, _cost
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


def test_a_window_stays_inline_by_the_cost_that_decides_a_fork(
    toy_runs: dict[str, ToyRun],
) -> None:
    """``stays_inline`` (the windowed compare's compare-ahead) says what :meth:`run` would
    decide from the same cost model: the toy's pairs stay in one process; as if it paid, not;
    with one process there is nothing else to do."""
    golden, target = toy_runs["golden"].records, toy_runs["faulty"].records
    runner = JobRunner(lambda *a, **k: None, None, jobs=2)
    work = _works(toy_runs["golden"], toy_runs["faulty"])
    assert sum(_cost(w) for w in work) < runner.MIN_PARALLEL_COST
    assert runner.stays_inline(golden, target)
    runner.MIN_PARALLEL_COST = sum(_cost(w) for w in work) / 2
    assert not runner.stays_inline(golden, target)
    runner.jobs = 1
    assert runner.stays_inline(golden, target)
    runner.jobs = 2
    with runner.alone():
        assert runner.jobs == 1 and runner.stays_inline(golden, target)
    assert runner.jobs == 2


def test_a_window_that_would_load_the_kernel_does_not_stay_inline(
    toy_runs: dict[str, ToyRun], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window compared ahead runs in this process while forked children compare the window
    before: if its elements loaded the compiled kernel there (``fused.MIN_ELEMS``), this
    process's units of that window would meet the kernel and the children's the numpy path,
    whose last digits differ. So it stays inline only when counting it changes nothing."""
    from layerwatch.engine.numerics import fused

    golden, target = toy_runs["golden"].records, toy_runs["faulty"].records
    elems = sum(math.prod(r.shape) for r in golden if r.loc is not None)
    runner = JobRunner(lambda *a, **k: None, None, jobs=2)
    monkeypatch.delenv("LAYERWATCH_NO_NUMBA", raising=False)
    monkeypatch.setitem(fused._STATE, "kernel", None)
    monkeypatch.setitem(fused._STATE, "failed", False)
    monkeypatch.setitem(fused._STATE, "seen", 0)
    monkeypatch.setattr(fused, "MIN_ELEMS", elems + 1)
    assert runner.stays_inline(golden, target)  # still short of loading it
    monkeypatch.setitem(fused._STATE, "seen", 1)
    assert not runner.stays_inline(golden, target)  # these elements would load it
    monkeypatch.setenv("LAYERWATCH_NO_NUMBA", "1")
    assert runner.stays_inline(golden, target)  # never loaded: nothing changes
    monkeypatch.delenv("LAYERWATCH_NO_NUMBA")
    monkeypatch.setitem(fused._STATE, "failed", True)
    assert runner.stays_inline(golden, target)  # cannot be loaded


def test_units_cover_every_pair_once_large_alone_largest_first(
    toy_runs: dict[str, ToyRun], monkeypatch: pytest.MonkeyPatch
) -> None:
    from layerwatch.engine.numerics.segments import SMALL

    work = _works(toy_runs["golden"], toy_runs["faulty"])
    monkeypatch.setattr(jobs, "UNIT_PAIRS", 8)
    monkeypatch.setattr("layerwatch.engine.numerics.segments.SMALL", 128)  # some toy pairs large
    costs = [_cost(w) for w in work]
    units = JobRunner.units(work, costs)
    assert sorted(i for u in units for i in u) == list(range(len(work)))
    for unit in units:
        sizes = [math.prod(work[i].golden.shape) for i in unit]
        assert len(unit) == 1 or (len(unit) <= 8 and max(sizes) <= 128 and unit == sorted(unit))
    assert any(len(u) == 1 and math.prod(work[u[0]].golden.shape) > 128 for u in units)
    unit_costs = [sum(costs[i] for i in u) for u in units]
    assert unit_costs == sorted(unit_costs, reverse=True)
    assert SMALL > 128  # the patch did not leak


def test_a_unit_queue_gives_each_unit_to_one_process() -> None:
    if not can_fork():
        pytest.skip("fork is used only on Linux with a single thread")
    queue = UnitQueue(2000, reserved=2)
    try:
        child = Forked(lambda: [u for u in queue.take(1) if not time.sleep(0.0001)])
        mine = [u for u in queue.take(0) if not time.sleep(0.0001)]
        theirs = child.result()
    finally:
        queue.close()
    assert mine[0] == 0 and theirs[0] == 1  # each process's reserved unit comes first
    assert len(theirs) > 1 and len(mine) > 1  # both took from the pipe
    assert sorted(mine + theirs) == list(range(2000))
    with pytest.raises(ValueError):
        UnitQueue(UnitQueue.LIMIT + 1)


def _acting(parent: int, act, in_child: bool):
    """compare_noting_pid, but a forked child (``in_child``) or the process ``parent`` first
    does ``act()`` for each pair."""

    def compare(golden, target, thresholds, *, is_logits=False, side_stats=False):
        if (os.getpid() != parent) == in_child:
            act()
        return compare_noting_pid(
            golden, target, thresholds, is_logits=is_logits, side_stats=side_stats
        )

    return compare


def _two_processes(
    runs: dict[str, ToyRun], monkeypatch: pytest.MonkeyPatch, act, in_child: bool = True
) -> tuple:
    """(work, the runner, its results): the toy's pairs in units of 4 compared by this process
    and a forked child, the child (or, not ``in_child``, this process) doing ``act()`` before
    each pair."""
    if not can_fork():
        pytest.skip("fork is used only on Linux with a single thread")
    from layerwatch.engine.numerics.thresholds import Thresholds

    monkeypatch.setattr(jobs, "UNIT_PAIRS", 4)
    work = _works(runs["golden"], runs["faulty"])
    runner = JobRunner(_acting(os.getpid(), act, in_child), Thresholds.default(), jobs=2)
    runner.MIN_PARALLEL_COST = 0.0
    return work, runner, runner.run(work)


def test_a_slow_child_takes_fewer_units_and_results_stay_the_same(
    toy_runs: dict[str, ToyRun], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Static shares waited for the slower process; from a queue it simply takes fewer units."""
    work, runner, two = _two_processes(toy_runs, monkeypatch, lambda: time.sleep(0.02))
    one = JobRunner(compare_noting_pid, runner.thresholds, jobs=1).run(work)
    assert _key_metrics(two) == _key_metrics(one)
    assert runner.shares_elsewhere == 1 and runner._pool is None  # a forked child, no pool
    by_pid = [sum(r.node_type == pid for r in two) for pid in {r.node_type for r in two}]
    assert len(by_pid) == 2 and min(by_pid) < len(work) // 4  # static shares: a half each


def test_a_slow_parent_leaves_the_units_to_its_child(
    toy_runs: dict[str, ToyRun], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue is read a unit at a time by every process, this one too: it once read the
    whole pipe up front, leaving a child nothing but its first unit, however fast it was."""
    work, _, two = _two_processes(toy_runs, monkeypatch, lambda: time.sleep(0.02), False)
    by_child = sum(r.node_type != str(os.getpid()) for r in two)
    assert by_child > len(work) // 2


def test_a_child_that_dies_fails_only_the_units_it_took(
    toy_runs: dict[str, ToyRun], monkeypatch: pytest.MonkeyPatch
) -> None:
    work, _, results = _two_processes(toy_runs, monkeypatch, _die)
    failed = [r for r in results if r.verdict is Verdict.ERROR]
    assert len(results) == len(work) and 1 <= len(failed) <= 4  # its first unit, then it died
    assert all(r.reason.startswith("compare worker failed: ChildProcessError") for r in failed)
    assert all(r.golden is w.golden for r, w in zip(results, work, strict=True))
    assert all(r.verdict is not Verdict.ERROR for r in results if r not in failed)


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


@pytest.mark.parametrize(
    ("cores", "load", "expected"),
    [(2, 0.0, 2), (2, 1.4, 2), (2, 1.5, 1), (2, 3.0, 1), (8, 2.0, 7), (8, 0.0, 8), (1, 0.0, 1)],
)
def test_jobs_0_adds_a_process_per_core_the_load_leaves_idle(
    cores: int, load: float, expected: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--jobs 0: a second process on a core the box is using anyway is only waited for (its
    fork, its copied pages); an explicit --jobs N is taken as given whatever the load."""
    from layerwatch.capture import cpus

    monkeypatch.setattr(cpus, "cores", lambda: cores)
    monkeypatch.setattr(cpus.os, "getloadavg", lambda: (load, load, load))
    assert JobRunner(lambda *a, **k: None, None, jobs=0).jobs == expected
    assert JobRunner(lambda *a, **k: None, None, jobs=2).jobs == 2
