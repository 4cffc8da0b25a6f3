"""The live session keeps settled tokens in the result store (engine/session/settled.py): same
rows, findings, cells and drill-down as the whole-run session, a few hundred bytes a pair.

Real captures of the demo model (a fault that makes the run diverge, so DIVERGED rows, a first
failure and a root cause are all in play), fed a token at a time as a live run lands, and the
synthetic layerwatch dumps of tests/bench/bench_scale.py for the memory figure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from bench.bench_scale import write_dump
from layerwatch.engine import report
from layerwatch.engine.readers import ReaderUpdate, open_dump
from layerwatch.engine.records import PairResult, TensorKey
from layerwatch.engine.session import settled, store
from layerwatch.engine.session.cells import aggregate, same_cell
from layerwatch.engine.session.core import CompareSession
from layerwatch.engine.session.settled import EXTRA, SettledTokens
from layerwatch.engine.session.store import ROW

CLI = [sys.executable, "-m", "layerwatch.tui.cli"]
SMALL = "import layerwatch.engine.session.store as s; s.CHUNK, s.POOL_CHUNK = 64, 100\n"
CLI_MAIN = "import sys\nfrom layerwatch.tui.cli import main\nsys.exit(main(sys.argv[1:]))\n"
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Golden and a ``rmsnorm_eps`` target (fails at token 2, then diverges) of the demo model."""
    from layerwatch.capture import DumpConfig, register_hook
    from layerwatch.capture.demo import build_model, generate, make_prompt

    root = tmp_path_factory.mktemp("live-store")
    for side, fault in (("golden", None), ("target", "rmsnorm_eps")):
        model = build_model(fault=fault)
        with register_hook(model, DumpConfig(dump_path=root / side)):
            generate(model, make_prompt(), NEW_TOKENS)
    return root / "golden", root / "target"


def _by_token(path: Path, side: str) -> tuple[ReaderUpdate, dict[int, ReaderUpdate]]:
    """A finished dump as a live run hands it over: topology first, then token by token."""
    whole = open_dump(path, side=side).poll(None, final=True)
    head = ReaderUpdate(topology=whole.topology, weights=dict(whole.weights))
    tokens: dict[int, ReaderUpdate] = {}
    for record in whole.tensors:
        tokens.setdefault(record.key.token, ReaderUpdate()).tensors.append(record)
    for token, ids in whole.token_ids.items():
        tokens.setdefault(token, ReaderUpdate()).token_ids[token] = ids
    return head, tokens


def _whole(golden: Path, target: Path) -> CompareSession:
    session = CompareSession(jobs=1)
    for side, path in (("golden", golden), ("target", target)):
        session.add_update(side, open_dump(path, side=side).poll(None, final=True))
        session.finish(side)
    session.flush()
    return session


def _live(golden: Path, target: Path, spill: Path | None = None) -> tuple[CompareSession, int]:
    """A compact session fed token by token (flushing after each); also how many pairs had
    settled before the runs finished. ``spill``: the settled store's full chunks go there."""
    session = CompareSession(jobs=1, compact=True, spill=spill)
    sides = {"golden": _by_token(golden, "golden"), "target": _by_token(target, "target")}
    for side, (head, _) in sides.items():
        session.add_update(side, head)
    for token in sorted(sides["golden"][1]):
        for side, (_, tokens) in sides.items():
            session.add_update(side, tokens.get(token, ReaderUpdate()))
        session.flush()
    settled_live = len(session.settled)
    for side in sides:
        session.finish(side)
    session.flush()
    return session, settled_live


def _row(r: PairResult) -> tuple[object, ...]:
    return (json.dumps(r.to_json(), sort_keys=True), r.order, r.block, r.failed, r.is_logits)


@pytest.mark.parametrize("spill", [False, True], ids=["ram", "spilled"])
def test_a_live_session_in_the_store_equals_the_whole_run_session(
    demo_runs: tuple[Path, Path], spill: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also with the settled store spilled to disk: chunks made small (module constants
    patched) so the capture's few thousand pairs fill many of them."""
    golden, target = demo_runs
    whole = _whole(golden, target)
    if spill:
        monkeypatch.setattr(store, "CHUNK", 64)
        monkeypatch.setattr(store, "POOL_CHUNK", 100)
    live, settled_live = _live(golden, target, tmp_path if spill else None)
    assert settled_live > len(whole.results()) // 2  # most tokens settled while the runs ran
    assert not live._records["golden"] and not live._pairs  # nothing kept but the store
    if spill:  # all but the chunk being filled is on disk
        assert (
            live.settled.store.disk_bytes
            >= (len(live.settled) - 64) * live.settled.store.dtype.itemsize
        )
        assert live.settled.store.nbytes <= 64 * live.settled.store.dtype.itemsize + 100 * 8
    assert len(live._emitted) < len(whole.cells()) // 4  # settled cells are table rows
    assert [_row(r) for r in live.results()] == [_row(r) for r in whole.results()]
    assert [_row(r) for part in live.results_by_token() for r in part] == [
        _row(r) for r in whole.results()
    ]
    # rows read back a block at a time (a report's reads) are the rows read one at a time
    one_by_one = [repr(live.settled.result(i)) for i in range(len(live.settled))]
    assert [repr(r) for r in live.settled.results()] == one_by_one
    # a CSV report written from the store's columns is the one its PairResults give (in
    # blocks smaller than a token: each block's data_id goes on from the last)
    monkeypatch.setattr(settled, "READ_ROWS", 100)
    lines, data_id = [], 0
    for part in live.report_parts():
        if isinstance(part, range):
            text = report.field_lines(live.settled_fields(part, report.LINE_METRICS), data_id)
            assert text == "".join(
                report.csv_line(r, i) for i, r in enumerate(live.settled_results(part), data_id)
            )
        else:
            text = "".join(report.csv_line(r, i) for i, r in enumerate(part, data_id))
        lines.append(text)
        data_id += text.count("\n")
    assert "".join(lines) == "".join(report.csv_line(r, i) for i, r in enumerate(whole.results()))
    assert whole.first_failure is not None and whole.divergence is not None
    assert live.first_failure == whole.first_failure
    first = whole.first_failure
    row = live.settled.cells.first_row((first.token, first.block))  # the cell's first failure
    assert row >= 0 and live.settled.result(row).key == TensorKey(
        first.token, first.node, first.stem, first.rank
    )
    assert live.root_cause == whole.root_cause
    assert live.first_bad_token == whole.first_bad_token
    assert live.divergence == whole.divergence
    assert live.summary == whole.summary
    cells, expected = live.cells(), whole.cells()
    assert cells.keys() == expected.keys()
    assert all(same_cell(cells[c], expected[c]) for c in expected)
    for rank in (None, 0):
        (ranks, got), (want_ranks, want) = live.rank_cells(rank), whole.rank_cells(rank)
        assert ranks == want_ranks == (0,)
        assert sorted((c.token, c.block) for c in got) == sorted((c.token, c.block) for c in want)
        by_cell = {(c.token, c.block): c for c in want}
        assert all(same_cell(c, by_cell[(c.token, c.block)]) for c in got)
    for token, block in list(expected)[::7]:
        got = live.pairs_in_block(token, block)
        assert [_row(r) for r in got] == [_row(r) for r in whole.pairs_in_block(token, block)]
        for result in got[:3]:
            assert [_row(r) for r in live.inputs_of(result)] == [
                _row(r) for r in whole.inputs_of(result)
            ]
    detail = live.explain(
        live.pairs_in_block(whole.first_failure.token, whole.first_failure.block)[0]
    )
    assert detail.golden is not None and detail.golden.stats is not None  # re-read from the bytes


@pytest.mark.parametrize("spill", [False, True], ids=["ram", "spilled"])
def test_open_of_a_real_capture_writes_compares_report(
    demo_runs: tuple[Path, Path], tmp_path: Path, spill: bool
) -> None:
    """``open --headless`` (the live session, settling as it reads) against ``compare``
    (windows of tokens): the same JSON on stdout and the same CSV, byte for byte — also with
    the live store spilled (``LAYERWATCH_SPILL=always``, chunks of 64 rows in the child)."""
    golden, target = demo_runs
    where = tmp_path / "spill"
    where.mkdir()
    env = {**os.environ, "LAYERWATCH_SPILL_DIR": str(where)}
    if spill:
        env["LAYERWATCH_SPILL"] = "always"
    out = {}
    for command in ("open", "compare"):
        extra = ["--headless"] if command == "open" else []
        cli = [sys.executable, "-c", SMALL + CLI_MAIN] if spill and command == "open" else CLI
        report = tmp_path / f"{command}.csv"
        done = subprocess.run(
            [*cli, command, str(golden), str(target), *extra, "--jobs", "1", "--json"],
            capture_output=True,
            text=True,
            env=env,
        )
        assert done.returncode == 1, done.stderr
        again = subprocess.run(
            [*cli, command, str(golden), str(target), *extra, "--jobs", "1", "-o", str(report)],
            capture_output=True,
            text=True,
            env=env,
        )
        assert again.returncode == 1, again.stderr
        out[command] = (json.loads(done.stdout), report.read_bytes())
    assert out["open"][0]["first_failure"] is not None
    assert out["open"] == out["compare"]
    assert not any(where.iterdir())  # the spill files had no name


@pytest.mark.parametrize("spill", [False, True], ids=["ram", "spilled"])
def test_a_settled_pair_costs_under_256_bytes(
    tmp_path: Path, spill: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory the live session holds a pair once its token settled: store row (CSV extras
    included) and metric values, its share of the cells table, plus every Python object that
    grew (traced allocations, not RSS: exact). Spilled (chunks made small so many fill up),
    what stays in RAM is a few bytes a pair: the per-token index, cells and names."""
    if spill:
        monkeypatch.setattr(store, "CHUNK", 1024)
        monkeypatch.setattr(store, "POOL_CHUNK", 4096)
    write_dump(tmp_path / "g" / "cpu_1", 40, 600, noise=0.0, seed=1)
    write_dump(tmp_path / "t" / "cpu_2", 40, 600, noise=1e-7, seed=2, faults=((30, 5),))
    sides = {
        "golden": _by_token(tmp_path / "g", "golden"),
        "target": _by_token(tmp_path / "t", "target"),
    }
    session = CompareSession(jobs=1, compact=True, spill=tmp_path if spill else None)
    for side, (head, _) in sides.items():
        session.add_update(side, head)

    def feed(tokens: range) -> None:
        for token in tokens:
            for side, (_, by_token) in sides.items():
                session.add_update(side, by_token.pop(token))
            session.flush()

    tracemalloc.start()  # the records were read before: only the session's own objects count
    feed(range(10))  # the store's first chunks are allocated (65 536 rows, 1 M values)
    before = tracemalloc.get_traced_memory()[0]  # the live tokens' objects are in both figures
    settled = session.settled
    rows, values = len(settled), settled.store._pool_n
    feed(range(10, 40))
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    pairs = len(settled) - rows
    assert pairs >= 27 * 600 and len(session._records["golden"]) <= 3 * 600
    if spill:  # numpy's allocations are traced too: the chunks came and went
        assert settled.store.disk_bytes >= (len(settled) - 1024) * settled.store.dtype.itemsize
        assert grown / pairs <= 32, grown / pairs
        return
    assert settled.store.dtype.itemsize == ROW.itemsize + EXTRA.itemsize
    column_bytes = pairs * settled.store.dtype.itemsize + (settled.store._pool_n - values) * 8
    # The chunks were allocated before: traced growth is the objects; the columns fill them.
    assert (grown + column_bytes) / pairs <= 256, (grown / pairs, column_bytes / pairs)


def test_settled_rows_spilled_to_disk_take_new_columns(
    demo_runs: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grid's columns change after tokens settled (a topology landing late): every row's
    block is rewritten where it lies, on disk included, and the cells rebuilt from them."""
    monkeypatch.setattr(store, "CHUNK", 64)
    monkeypatch.setattr(store, "POOL_CHUNK", 100)
    golden, target = demo_runs
    results = [r for r in _whole(golden, target).results() if r.verdict.value != "unpaired"]
    settled = SettledTokens(tmp_path)
    for token in sorted({r.key.token for r in results}):
        settled.add_token(token, [r for r in results if r.key.token == token], None, None)
    assert settled.store.disk_bytes > 0
    moved = {key: (block + 1) // 2 for key, block in settled.blocks.items()}  # columns merged
    settled.relayout(moved)
    again = list(settled.results())
    assert [r.block for r in again] == [moved[(r.key.node, r.key.part)] for r in results]
    for token in settled.ranges:
        want = {
            block: aggregate(
                token, block, [r for r in again if r.key.token == token and r.block == block]
            )
            for block in {r.block for r in again if r.key.token == token and r.block >= 0}
        }
        got = {c.block: c for c in settled.cells_of(token)}
        assert got.keys() == want.keys()
        assert all(same_cell(got[b], want[b]) for b in want)


def test_a_watched_run_forgets_the_keys_of_settled_tokens(tmp_path: Path) -> None:
    """A watched side's reader hands each key out once, remembering it; once the session
    settled a token the reader is told to forget its keys (else they grow with every tensor
    of the run, ~130 bytes each)."""
    from layerwatch.engine.live.pipeline import LivePipeline, attach_spec

    write_dump(tmp_path / "g" / "cpu_1", 12, 60, noise=0.0, seed=1)
    write_dump(tmp_path / "t" / "cpu_2", 12, 60, noise=1e-7, seed=2)
    session = CompareSession(jobs=1, compact=True)
    pipeline = LivePipeline(
        attach_spec(tmp_path / "g", idle_s=0.2),
        attach_spec(tmp_path / "t", idle_s=0.2),
        session=session,
    )
    pipeline.start()
    try:
        assert pipeline.wait(60), "the pipeline did not finish"
    finally:
        pipeline.stop()
    assert len(session.settled) == 12 * 60 and session.settled_floor() == 12
    for side in pipeline.sides.values():
        assert not side.chunked
        kept = [t for rank in side.reader._ranks.values() for t in rank.seen]  # type: ignore[union-attr]
        assert kept == [], kept
