"""A result store that spills its full chunks to disk: the same rows and reports as in RAM,
its files gone at close and on error, a full disk one line, and RAM that does not grow with the
pairs (engine/session/store.py; the live session's, engine/session/settled.py). A headless
``compare`` keeps no store: it writes no spill file and its estimate grows no store
(engine/session/windowed.py, engine/session/budget.py).

Chunks are made small (module constants patched, in-process or by a wrapper in the child) so
a few thousand real pairs spill many chunks.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from bench.bench_scale import write_dump
from layerwatch.engine.readers import open_dump
from layerwatch.engine.records import PairResult, TensorKey, Verdict
from layerwatch.engine.session import budget, store
from layerwatch.engine.session.core import CompareSession
from layerwatch.engine.session.store import ROW, ResultStore

SMALL = "import layerwatch.engine.session.store as s; s.CHUNK, s.POOL_CHUNK = {}, {}\n"
CLI_MAIN = "import sys\nfrom layerwatch.tui.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def _cli(rows: int = 256, pool: int = 512, before: str = "") -> list[str]:
    """``layerwatch`` in a child whose store chunks hold ``rows`` rows, ``pool`` values."""
    return [sys.executable, "-c", SMALL.format(rows, pool) + before + CLI_MAIN]


def _dumps(tmp: Path, tokens: int, tensors: int, **target: object) -> tuple[Path, Path]:
    write_dump(tmp / "golden" / "cpu_1", tokens, tensors, noise=0.0, seed=1)
    write_dump(tmp / "target" / "cpu_2", tokens, tensors, noise=1e-7, seed=2, **target)  # type: ignore[arg-type]
    return tmp / "golden", tmp / "target"


def _results(golden: Path, target: Path) -> list[PairResult]:
    session = CompareSession(jobs=1, side_stats=True)
    for side, path in (("golden", golden), ("target", target)):
        session.add_update(side, open_dump(path, side=side).poll(None, final=True))  # type: ignore[attr-defined]
        session.finish(side)
    session.flush()
    return session.results()


def _open_fds_in(directory: Path) -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory)):
            found.append(target)
    return found


def test_a_spilled_store_gives_back_what_the_in_ram_store_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "CHUNK", 64)
    monkeypatch.setattr(store, "POOL_CHUNK", 100)
    golden, target = _dumps(tmp_path, 10, 40, faults=((2, 3),))
    results = _results(golden, target)
    odd = PairResult(TensorKey(9, "n", "output"), Verdict.ERROR, {"a": math.nan, "b": -0.0})
    results.append(odd)
    spill = tmp_path / "spill"
    spill.mkdir()
    ram, disk = ResultStore(), ResultStore(spill)
    for at in range(0, len(results), 77):  # batches that straddle chunks
        ram.append(results[at : at + 77])
        disk.append(results[at : at + 77])
    assert len(disk) == len(ram) == len(results) > 6 * 64
    assert disk.disk_bytes >= 6 * 64 * ROW.itemsize and not ram.disk_bytes
    assert disk.nbytes <= 64 * ROW.itemsize + 100 * 8  # only the chunks being filled
    for i in [*range(len(results)), *reversed(range(len(results)))]:  # the cache turns over
        assert json.dumps(disk.row(i)) == json.dumps(ram.row(i))
        a, b = disk.result(i), ram.result(i)
        assert (a.key, a.verdict, a.failed, a.reason, a.order, a.block, a.is_logits) == (
            b.key,
            b.verdict,
            b.failed,
            b.reason,
            b.order,
            b.block,
            b.is_logits,
        )
        assert a.golden == b.golden and a.target == b.target
    for name in ROW.names:
        assert (disk.column(name) == ram.column(name)).all(), name
    assert math.isnan(disk.metrics(len(results) - 1)["a"])
    for i, result in enumerate(results[:-1]):  # values straddling pool chunks come back whole
        assert ram.metrics(i) == result.metrics, i
    assert len(disk._cache) <= store.CACHED  # reads do not bring the store back
    disk.close()
    ram.close()


def test_spill_files_are_removed_at_close_and_when_dropped(tmp_path: Path) -> None:
    record = PairResult(TensorKey(0, "n", "output"), Verdict.PASS, {"x": 0.5})
    unnamed = ResultStore(tmp_path)
    unnamed.append([record] * (store.CHUNK + 1))
    assert unnamed.disk_bytes and not list(tmp_path.iterdir())  # O_TMPFILE: no name at all
    assert _open_fds_in(tmp_path)
    unnamed.close()
    assert not _open_fds_in(tmp_path)
    dropped = ResultStore(tmp_path)
    dropped.append([record] * (store.CHUNK + 1))
    del dropped  # a run that ends in an exception drops its store
    assert not _open_fds_in(tmp_path)
    with ResultStore(tmp_path, keep=True) as kept:
        kept.append([record] * (store.CHUNK + 1))
        paths = kept.spill_paths
    assert len(paths) == 2 and all(p.exists() for p in paths)  # kept: named, left
    assert paths[0].stat().st_size == store.CHUNK * ROW.itemsize  # the one full chunk


def test_compare_keeps_no_store_whatever_layerwatch_spill_says(tmp_path: Path) -> None:
    """Chunks of 256 rows: the 2 800 pairs filled ten when ``compare`` stored its pairs. Now
    the report is the same byte for byte with ``LAYERWATCH_SPILL`` never and always, nothing
    is written beside it or in the spill directory, and no note says results were spilled."""
    golden, target = _dumps(tmp_path, 14, 200, faults=((3, 5),), diverge_at=11)
    spill = tmp_path / "spill"
    spill.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LAYERWATCH_SPILL_DIR": str(spill)}
    reports = {}
    for mode in ("never", "always"):
        for suffix in (".csv", ".jsonl"):
            out = tmp_path / f"{mode}{suffix}"
            done = subprocess.run(
                [*_cli(), "compare", str(golden), str(target), "-o", str(out), "--jobs", "1"],
                env={**env, "LAYERWATCH_SPILL": mode},
                capture_output=True,
                text=True,
            )
            assert done.returncode == 1, done.stderr  # the fault is found either way
            reports[mode, suffix] = out.read_bytes()
    for suffix in (".csv", ".jsonl"):
        assert reports["always", suffix] == reports["never", suffix]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == sorted(
        f"{m}{s}" for m in ("never", "always") for s in (".csv", ".jsonl")
    )  # nothing beside the reports
    said = subprocess.run(
        [*_cli(), "compare", str(golden), str(target), "--jobs", "1"],
        env={**env, "LAYERWATCH_SPILL": "always"},
        capture_output=True,
        text=True,
    )
    assert said.returncode == 1 and "pairs: 2800 compared" in said.stdout, said.stdout
    assert "spilled" not in said.stdout and not any(spill.iterdir())


def test_a_windowed_compare_is_refused_only_when_its_window_and_tables_do_not_fit() -> None:
    """What a store of 256 B a pair made too big for 2 GB (8 M pairs: 2.2 GB with the window)
    fits now: the window, a token's tables and the index columns; less than that is the one
    line with the ``--tokens`` that fit. A whole-run session still counts every pair's records."""
    big = budget.Estimate(8_000_000, 4_000, windowed=True)
    budget.check(big, 2 << 30)  # 160 MB of window, 1 GB of columns, 8 MB of token tables
    assert big.nbytes < 2 << 30 < 8_000_000 * 256 + budget.WINDOW_BYTES
    per_token = 2_000 * budget.ROW_PAIR_BYTES + budget.TOKEN_BYTES
    fit = (200 << 20) - budget.WINDOW_BYTES
    with pytest.raises(budget.LayerwatchError, match=f"--tokens 0-{fit // per_token - 1} fits"):
        budget.check(big, 200 << 20)
    with pytest.raises(budget.LayerwatchError, match="not even one token fits") as err:
        budget.check(big, budget.WINDOW_BYTES)
    assert "\n" not in str(err.value)
    whole = budget.Estimate(1_000_000, 10, windowed=False)  # a whole-run session: 6 GB
    with pytest.raises(budget.LayerwatchError, match="--tokens 0-"):
        budget.check(whole, 1 << 30)


def test_a_full_disk_while_the_live_session_spills_is_one_line(tmp_path: Path) -> None:
    """A 512 KB tmpfs (in a private mount namespace: nothing is left mounted) holds the spill:
    ``open --headless``, whose settled store spills, stops with one line naming it and exit 2;
    ``compare`` of the same dumps, given the same full spill directory, writes nothing there
    and its whole report."""
    unshare = shutil.which("unshare")
    probe = subprocess.run(
        [unshare or "unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {tmp_path}"],
        capture_output=True,
    )
    if unshare is None or probe.returncode:
        pytest.skip("no private mount namespace here to make a small tmpfs in")
    golden, target = _dumps(tmp_path / "dumps", 30, 400)
    spill, report = tmp_path / "spill", tmp_path / "report.csv"
    spill.mkdir()
    script = f'mount -t tmpfs -o size=512k tmpfs {spill} && exec "$@"'
    env = {**os.environ, "LAYERWATCH_SPILL": "always", "LAYERWATCH_SPILL_DIR": str(spill)}
    said = {}
    for command, extra in (("open", ["--headless"]), ("compare", [])):
        run = [*_cli(1024, 512), command, str(golden), str(target), *extra, "-o", str(report)]
        said[command] = subprocess.run(
            [unshare, "-rm", "sh", "-c", script, "sh", *run, "--jobs", "1"],
            env=env,
            capture_output=True,
            text=True,
        )
    live = said["open"]
    assert live.returncode == 2 and live.stderr.count("No space left") == 1, live.stderr
    assert "spilling results to" in live.stderr.splitlines()[-1], live.stderr
    done = said["compare"]
    assert done.returncode in (0, 1) and not done.stderr, done.stderr  # judged, not stopped
    lines = report.read_text().splitlines()
    assert len(lines) == 1 + 12_000 and not lines[-1].startswith("#"), lines[-1]


_RSS = """
import sys, numpy as np
from layerwatch.engine.records import PairResult, TensorKey, Verdict
from layerwatch.engine.session.store import ResultStore

def kb(field):
    with open("/proc/self/status") as fh:
        return int(next(l for l in fh if l.startswith(field)).split()[1])

rng = np.random.default_rng(0)
batch = [
    PairResult(TensorKey(0, f"node{i % 500}", "output"), Verdict.PASS,
               {m: float(v) for m, v in zip("abcdef", rng.random(6))})
    for i in range(10_000)
]
store = ResultStore(sys.argv[1] if len(sys.argv) > 1 else None)
start = kb("VmRSS")
for _ in range(100):
    store.append(batch)
assert len(store) == 1_000_000
tokens = store.column("token")
rows = [store.row(i)["metrics"]["a"] for i in range(0, len(store), 997)]
print(kb("VmHWM") - start, store.disk_bytes)
"""


def test_ram_of_a_spilled_store_does_not_grow_with_its_pairs(tmp_path: Path) -> None:
    """A million pairs: in RAM ~150 MB of columns, spilled only the chunks being filled and
    the read cache (~45 MB at most), after a full column scan and reads all over the store.
    Peak RSS, with margins of tens of MB either side: not a flaky figure."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    grown = {}
    for name, extra in (("ram", []), ("spill", [str(tmp_path)])):
        out = subprocess.run(
            [sys.executable, "-c", _RSS, *extra], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        kb, disk = map(int, out.stdout.split())
        grown[name] = kb * 1024
        assert (disk > 100_000_000) == (name == "spill")
    assert grown["ram"] > 130 << 20, grown  # the measurement sees the store
    assert grown["spill"] < 64 << 20, grown  # measured ~33 MB
