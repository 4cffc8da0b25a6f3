"""The incremental session on real tensors: verdicts, first failure vs root cause, divergence,
cells, unpaired tensors, duplicates, the process pool, thread safety."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import numpy as np
import pytest
from layerwatch.engine.records import COSINE, LOCAL, TensorRecord, Verdict
from layerwatch.engine.seam import CellState, QueueSink
from layerwatch.engine.session.core import CompareSession
from support.sessions import finished_session
from support.toy_model import Fault, ToyModel, ToyRun


def compare(golden: ToyRun, target: ToyRun, **kwargs: object) -> CompareSession:
    return finished_session(golden.update(), target.update(), **kwargs)


def teacher_forced(golden: ToyRun, tokens: int = 4) -> dict[int, int]:
    return {t: golden.token_ids[t][0] for t in range(1, tokens)}


def test_clean_rerun_passes(toy_runs: dict[str, ToyRun]) -> None:
    session = compare(toy_runs["golden"], toy_runs["clean"])
    s = session.summary
    assert s.pairs == len(toy_runs["golden"].records) and s.passed == s.pairs
    assert session.first_failure is None and session.root_cause is None
    assert session.first_bad_token is None
    assert all(c.state is CellState.PASS for c in session.cells().values())


def test_fault_propagates_root_cause_is_the_operator(toy_runs: dict[str, ToyRun]) -> None:
    session = compare(toy_runs["golden"], toy_runs["faulty"])
    bad = "root.model.layers.1.mlp.down_proj"
    first, cause = session.first_failure, session.root_cause
    assert first is not None and cause is not None
    assert (first.token, first.node, first.stem) == (1, bad, "output")
    assert (cause.token, cause.node) == (1, bad)
    assert cause.reason.startswith("output fails while its inputs pass")
    assert first.block_label == "L1"
    assert session.first_bad_token == 1
    # its effect propagates: later operators fail too, nothing before it does
    failing = {(r.key.token, r.key.node) for r in session.results() if r.verdict is Verdict.FAIL}
    assert {
        (1, "root.model.layers.1"),
        (1, "root.model.layers.2.mlp.down_proj"),
        (1, "root.lm_head"),
    } <= failing
    assert all(t >= 1 for t, _ in failing)
    # the first failure's cell (and only it) carries the glyph flag
    flagged = [k for k, c in session.cells().items() if c.first_bad]
    assert flagged == [(1, 2)]


def test_hidden_operator_fault_root_cause_is_its_module(tmp_path: Path, toy: ToyModel) -> None:
    """A fault in an operator no hook sees (tanh inside attention): o_proj's output fails first,
    but its input fails too, so the root cause is the attention module whose inputs pass."""
    golden = toy.run(tmp_path / "g")
    target = toy.run(
        tmp_path / "t",
        fault=Fault("root.model.layers.0.self_attn.tanh", scale=1.1),
        feed=teacher_forced(golden),
    )
    session = compare(golden, target)
    assert session.first_failure is not None and session.root_cause is not None
    assert (session.first_failure.token, session.first_failure.node) == (
        0,
        "root.model.layers.0.self_attn.o_proj",
    )
    assert (session.root_cause.token, session.root_cause.node) == (
        0,
        "root.model.layers.0.self_attn",
    )
    o_proj_in = [
        r
        for r in session.results()
        if r.key.node.endswith("0.self_attn.o_proj") and r.key.token == 0
    ]
    assert [r.verdict for r in o_proj_in] == [Verdict.FAIL, Verdict.FAIL]  # input_0, output


def test_inputs_not_captured_root_cause_is_first_failing_output(
    tmp_path: Path, toy: ToyModel
) -> None:
    golden = toy.run(tmp_path / "g", inputs=False)
    fault = Fault("root.model.layers.2.self_attn.q_proj", start=2, noise=0.2)
    target = toy.run(tmp_path / "t", inputs=False, fault=fault, feed=teacher_forced(golden))
    session = compare(golden, target)
    cause = session.root_cause
    assert cause is not None and (cause.token, cause.node) == (
        2,
        "root.model.layers.2.self_attn.q_proj",
    )
    assert "inputs were not captured" in cause.reason


def test_outputs_decide_before_inputs(toy_runs: dict[str, ToyRun]) -> None:
    """down_proj's output fails first; the failing *input* of a later node never comes first."""
    session = compare(toy_runs["golden"], toy_runs["faulty"])
    results = session.results()
    fails_t1 = [r for r in results if r.key.token == 1 and r.verdict is Verdict.FAIL]
    assert any(r.key.stem.startswith("input") for r in fails_t1)
    assert session.first_failure is not None and session.first_failure.stem == "output"


def test_divergence_marks_later_tokens_and_blames_none(tmp_path: Path, toy: ToyModel) -> None:
    golden = toy.run(tmp_path / "g")
    forced = teacher_forced(golden)
    forced[2] = (golden.token_ids[2][0] + 7) % toy.vocab  # the target was fed another id at token 2
    target = toy.run(tmp_path / "t", feed=forced)
    session = compare(golden, target)
    by_token: dict[int, set[Verdict]] = {}
    for r in session.results():
        by_token.setdefault(r.key.token, set()).add(r.verdict)
    assert by_token[0] == by_token[1] == {Verdict.PASS}
    assert by_token[2] == by_token[3] == {Verdict.DIVERGED}
    assert (
        session.first_failure is None
        and session.root_cause is None
        and session.first_bad_token is None
    )
    diverged = [r for r in session.results() if r.verdict is Verdict.DIVERGED]
    assert any(
        r.metrics.get(COSINE, 1.0) < 0.9 for r in diverged
    )  # metrics still computed and shown
    assert "fed different input ids at token 2" in diverged[0].reason
    assert {c.state for (t, _), c in session.cells().items() if t >= 2} == {CellState.DIVERGED}
    assert any("token 2" in n for n in session.notes)


def test_divergence_after_a_fault_keeps_the_fault(tmp_path: Path, toy: ToyModel) -> None:
    golden = toy.run(tmp_path / "g")
    target = toy.run(
        tmp_path / "t", fault=Fault("root.model.layers.0.mlp.up_proj", start=1, noise=0.5)
    )  # free-running
    session = compare(golden, target)
    assert session.first_failure is not None and session.first_failure.token == 1
    assert (
        session.root_cause is not None
        and session.root_cause.node == "root.model.layers.0.mlp.up_proj"
    )
    if target.token_ids != golden.token_ids:
        diverge = min(t for t in golden.token_ids if golden.token_ids[t] != target.token_ids[t])
        assert all(
            r.verdict is Verdict.DIVERGED for r in session.results() if r.key.token >= diverge
        )


def test_residual_hidden_fault_still_colours_the_layer(tmp_path: Path) -> None:
    model = ToyModel(seed=1)
    for i in range(model.layers):
        model.params[f"root.model.layers.{i}.mlp.down_proj.weight"] *= 0.01  # the MLP adds little
    golden = model.run(tmp_path / "g", tokens=2)
    fault = Fault("root.model.layers.1.mlp.down_proj", noise=0.15)
    target = model.run(tmp_path / "t", tokens=2, fault=fault, feed=teacher_forced(golden, 2))
    session = compare(golden, target)
    by_key = {(r.key.token, r.key.node, r.key.stem): r for r in session.results()}
    down = by_key[(0, "root.model.layers.1.mlp.down_proj", "output")]
    layer = by_key[(0, "root.model.layers.1", "output")]
    # the residual add hides it; containers are not judged locally (their inner operator is)
    assert down.verdict is Verdict.FAIL and layer.verdict is Verdict.PASS
    assert LOCAL not in layer.metrics and LOCAL in down.metrics
    assert session.first_failure is not None and session.first_failure.node == down.key.node
    cell = session.cells()[(0, down.block)]
    assert cell.state is CellState.FAIL and cell.first_bad
    assert cell.worst[0] == pytest.approx(down.metrics[COSINE])  # worst cosine in the block
    # the logits pass, so no token is bad even though an operator fails
    assert session.first_bad_token is None and session.first_failure is not None


def test_logits_pairs_use_logits_metrics(toy_runs: dict[str, ToyRun]) -> None:
    session = compare(toy_runs["golden"], toy_runs["clean"])
    logits = {(r.key.node, r.key.stem) for r in session.results() if r.is_logits}
    assert logits == {("root.lm_head", "output"), ("root", "output")}
    lm = next(r for r in session.results() if r.is_logits)
    assert "top1_agreement" in lm.metrics


def test_unpaired_pending_until_finished_then_reported(tmp_path: Path, toy: ToyModel) -> None:
    golden = toy.run(tmp_path / "g", tokens=2)
    target = toy.run(tmp_path / "t", tokens=2, feed=teacher_forced(golden, 2))
    dropped = "root.model.layers.0.mlp.act_fn"
    target.records = [r for r in target.records if r.key.node != dropped]
    extra = target.records[0]
    target.records.append(
        TensorRecord(
            extra.key.__class__(0, "root.model.extra", "output"),
            extra.dtype,
            extra.shape,
            extra.loc,
        )
    )
    session = CompareSession()
    session.add_update("golden", golden.update())
    session.add_update("target", target.update())
    session.flush()
    assert session.summary.unpaired == 0 and session.summary.pending == 5  # 4 golden + 1 target
    assert session.cells()[(0, 1)].state is CellState.PASS  # pending ones do not hide the passes
    session.finish("target")
    session.finish("golden")
    batch = session.flush()
    assert batch.done
    unpaired = [r for r in session.results() if r.verdict is Verdict.UNPAIRED]
    assert {(r.key.node, r.golden is not None) for r in unpaired} == {
        (dropped, True),
        ("root.model.extra", False),
    }
    assert len(unpaired) == 5 and session.summary.unpaired == 5
    assert all("only in the" in r.reason for r in unpaired)
    assert session.cells()[(0, 1)].state is CellState.PASS


def test_one_side_only_cells_are_waiting(toy_runs: dict[str, ToyRun]) -> None:
    session = CompareSession()
    session.add_update("golden", toy_runs["golden"].update())
    batch = session.flush()
    assert batch.cells and {c.state for c in batch.cells} == {CellState.WAITING}
    assert session.summary.pending == len(toy_runs["golden"].records)
    session.finish("target")
    assert {c.state for c in session.flush().cells} == {CellState.EMPTY}  # nothing will come
    assert session.summary.unpaired == len(toy_runs["golden"].records)


def test_duplicates_are_ignored(toy_runs: dict[str, ToyRun]) -> None:
    once = compare(toy_runs["golden"], toy_runs["faulty"])
    session = CompareSession()
    for _ in range(2):
        session.add_update("golden", toy_runs["golden"].update())
        session.add_update("target", toy_runs["faulty"].update())
        session.flush()
    session.finish("golden")
    session.finish("target")
    session.flush()
    assert session.summary == once.summary
    assert [(r.key, r.verdict) for r in session.results()] == [
        (r.key, r.verdict) for r in once.results()
    ]


def test_conflicting_duplicate_resolved_deterministically(
    tmp_path: Path, toy_runs: dict[str, ToyRun]
) -> None:
    golden, target = toy_runs["golden"], toy_runs["faulty"]
    first = target.records[0]
    twin = golden.records[0]  # same key, another file: the data differ from ``first``
    assert twin.key == first.key and twin.loc != first.loc
    other = TensorRecord(first.key, first.dtype, first.shape, twin.loc, source="a-first.bin")
    outcomes = []
    for records in ([first, other], [other, first]):
        session = CompareSession()
        session.add_update("golden", golden.update())
        session.add_records("target", records)
        session.finish("golden")
        session.finish("target")
        session.flush()
        kept = next(r for r in session.results() if r.key == first.key)
        outcomes.append(kept.target.source if kept.target else None)
        assert any("dumped twice" in n for n in session.notes)
    assert outcomes[0] == outcomes[1] == min(first.source, "a-first.bin")  # the smaller source wins


def test_tokens_selection(toy_runs: dict[str, ToyRun]) -> None:
    session = compare(toy_runs["golden"], toy_runs["faulty"], tokens="0,2-")
    assert {r.key.token for r in session.results()} == {0, 2, 3}


def test_live_batches_carry_only_changes(toy_runs: dict[str, ToyRun]) -> None:
    sink = QueueSink()
    session = CompareSession(sink=sink)
    golden, target = toy_runs["golden"], toy_runs["faulty"]
    session.add_update("golden", golden.update())
    by_token = lambda run, t: [r for r in run.records if r.key.token == t]  # noqa: E731
    session.add_records("target", by_token(target, 0))
    first = session.flush()
    assert first.blocks is not None and len(first.blocks) == 6
    assert {c.token for c in first.cells if c.state is not CellState.WAITING} == {0}
    assert session.flush().cells == []  # nothing new, nothing sent
    session.add_records("target", by_token(target, 1))
    second = session.flush()
    assert {c.token for c in second.cells} == {1}
    assert second.first_failure is not None and second.first_failure.token == 1
    assert second.blocks is None
    assert len(sink.drain()) == 2


def test_cells_read_between_batches_still_reach_the_sink(toy_runs: dict[str, ToyRun]) -> None:
    """``cells()`` (the TUI's rank selector reads it) must not take the cells that changed
    since the last batch out of the next one: the grid is built from the batches alone."""
    sink = QueueSink()
    session = CompareSession(sink=sink)
    golden, target = toy_runs["golden"], toy_runs["faulty"]
    session.add_update("golden", golden.update())
    session.add_records("target", [r for r in target.records if r.key.token < 2])
    session.flush()  # tokens 2 and 3 sent as WAITING
    session.finish("golden")
    session.finish("target")  # their golden tensors will never be paired: the cells empty
    read = session.cells()
    session.flush()
    grid: dict[tuple[int, int], CellState] = {}
    for batch in sink.drain():
        for cell in batch.cells:
            grid[(cell.token, cell.block)] = cell.state
    shown = {k: s for k, s in grid.items() if s is not CellState.EMPTY}
    now = {k: c.state for k, c in session.cells().items()}
    assert shown == now == {k: c.state for k, c in read.items()}
    assert {t for t, _ in now} == {0, 1} and {t for t, _ in grid} == {0, 1, 2, 3}


def test_topology_arriving_late_reassigns_blocks(toy_runs: dict[str, ToyRun]) -> None:
    session = CompareSession()
    session.add_update("golden", toy_runs["golden"].update(topology=False))
    session.add_update("target", toy_runs["faulty"].update(topology=False))
    early = session.flush()
    assert early.blocks is not None and [b.label for b in early.blocks] == [
        "embed",
        "L0",
        "L1",
        "L2",
        "norm",
        "lm_head",
    ]
    from layerwatch.engine.readers.base import ReaderUpdate

    session.add_update("golden", ReaderUpdate(topology=toy_runs["golden"].topology))
    late = session.flush()
    assert late.blocks is None or [b.label for b in late.blocks] == [b.label for b in early.blocks]
    assert session.first_failure is not None and session.first_failure.block_label == "L1"


def test_process_pool_gives_the_same_results(
    toy_runs: dict[str, ToyRun], monkeypatch: pytest.MonkeyPatch
) -> None:
    from layerwatch.engine.session.jobs import JobRunner

    monkeypatch.setattr(JobRunner, "MIN_PARALLEL_COST", 0.0)  # the toy is too small to pay
    inline = compare(toy_runs["golden"], toy_runs["faulty"])
    pooled = compare(toy_runs["golden"], toy_runs["faulty"], jobs=2)
    try:
        # 256 pairs: enough for the pool either way
        assert pooled.runner.jobs == 2 and len(toy_runs["golden"].records) >= 256
        a = [(r.key, r.verdict, r.metrics.get(COSINE)) for r in inline.results()]
        b = [(r.key, r.verdict, r.metrics.get(COSINE)) for r in pooled.results()]
        assert a == b
        assert pooled.runner.shares_elsewhere > 0  # another process (fork or pool) was really used
    finally:
        pooled.close()


def test_unreadable_tensor_is_an_error_pair(tmp_path: Path, toy: ToyModel) -> None:
    golden = toy.run(tmp_path / "g", tokens=1)
    target = toy.run(tmp_path / "t", tokens=1)
    victim = next(
        r
        for r in target.records
        if r.key.node == "root.model.layers.1.mlp.up_proj" and r.key.stem == "output"
    )
    Path(victim.loc.path).write_bytes(b"\0" * 8)  # truncated
    session = compare(golden, target)
    bad = next(r for r in session.results() if r.key == victim.key)
    assert bad.verdict is Verdict.ERROR and bad.reason and "\n" not in bad.reason
    assert session.summary.error == 1
    assert session.cells()[(0, bad.block)].state is CellState.ERROR


def test_views_are_safe_while_the_engine_works(toy_runs: dict[str, ToyRun]) -> None:
    session = CompareSession()
    stop = threading.Event()
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                for block in range(len(session.blocks())):
                    for r in session.pairs_in_block(1, block):
                        session.inputs_of(r)
                session.results()
                session.summary  # noqa: B018
        except BaseException as exc:  # pragma: no cover - the assertion below reports it
            errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for t in range(4):
            session.add_records(
                "golden", [r for r in toy_runs["golden"].records if r.key.token == t]
            )
            session.add_records(
                "target", [r for r in toy_runs["faulty"].records if r.key.token == t]
            )
            session.flush()
    finally:
        stop.set()
        thread.join()
    assert not errors
    assert session.summary.pairs == len(toy_runs["golden"].records)


def test_pairs_in_block_execution_order_and_explain(toy_runs: dict[str, ToyRun]) -> None:
    session = compare(toy_runs["golden"], toy_runs["faulty"])
    pairs = session.pairs_in_block(1, 2)
    orders = [r.order for r in pairs]
    assert orders == sorted(orders) and pairs[-1].key.node == "root.model.layers.1"
    down = next(r for r in pairs if r.key.node.endswith("down_proj") and r.key.stem == "output")
    inputs = session.inputs_of(down)
    assert [r.key.stem for r in inputs] == ["input_0"] and inputs[0].verdict is Verdict.PASS
    detail = session.explain(down)
    assert (
        detail.result.key == down.key and detail.worst and not math.isnan(detail.worst[0].abs_err)
    )
    assert np.isfinite(detail.histogram_counts).all()


def test_json_report_is_strict_with_non_finite_metrics(tmp_path: Path) -> None:
    import json

    from layerwatch.engine.readers.base import ReaderUpdate
    from layerwatch.engine.records import TensorKey
    from layerwatch.engine.report import dumps_json, json_report
    from support.toy_model import write_tensor

    key = TensorKey(0, "root.fc", "output")
    zeros = write_tensor(tmp_path / "g.bin", np.zeros((4, 8), np.float32), "float32")
    ones = write_tensor(tmp_path / "t.bin", np.ones((4, 8), np.float32), "float32")
    session = CompareSession()
    session.add_update(
        "golden", ReaderUpdate([TensorRecord(key, "float32", (4, 8), zeros)], complete=True)
    )
    session.add_update(
        "target", ReaderUpdate([TensorRecord(key, "float32", (4, 8), ones)], complete=True)
    )
    session.flush()
    (result,) = session.results()
    assert result.verdict is Verdict.FAIL and math.isinf(
        result.metrics["relative_euclidean_distance"]
    )
    text = dumps_json(
        json_report(
            session.results(),
            session.summary,
            session.first_failure,
            session.root_cause,
            session.first_bad_token,
        )
    )
    report = json.loads(text)
    assert report["rows"][0]["metrics"]["relative_euclidean_distance"] is None
    assert report["first_failure"]["metrics"]["relative_euclidean_distance"] is None
    assert report["summary"]["fail"] == 1


def test_one_side_kept_only_the_last_position(tmp_path: Path) -> None:
    """HF generate's LM head sees the last position only; the other run has all of them."""
    from layerwatch.engine.readers.base import ReaderUpdate
    from layerwatch.engine.records import TensorKey
    from support.toy_model import write_tensor

    full = np.random.default_rng(0).standard_normal((2, 3, 5)).astype(np.float32)
    key = TensorKey(0, "root.lm_head", "output")
    golden = TensorRecord(
        key, "float32", (2, 3, 5), write_tensor(tmp_path / "g.bin", full, "float32")
    )
    last = np.ascontiguousarray(full[:, -1:, :])
    good = TensorRecord(
        key, "float32", (2, 1, 5), write_tensor(tmp_path / "t.bin", last, "float32")
    )
    bad = TensorRecord(
        key, "float32", (2, 1, 5), write_tensor(tmp_path / "b.bin", full[:, :1, :], "float32")
    )
    verdicts = []
    for target in (good, bad):
        session = CompareSession()
        session.add_update("golden", ReaderUpdate([golden], complete=True))
        session.add_update("target", ReaderUpdate([target], complete=True))
        session.flush()
        (result,) = session.results()
        assert result.golden is not None and result.golden.shape == (2, 1, 5)
        verdicts.append(result.verdict)
        assert any("kept only the last position" in n for n in session.notes)
    assert verdicts == [Verdict.PASS, Verdict.FAIL]  # the last position, not the first


def test_shared_payloads_compare_once_but_judge_per_node(tmp_path: Path) -> None:
    """Two nodes reading the very same bytes (the layerwatch writer stores a tensor once when the
    next module's input is the previous one's output) share metrics; a per-node override still
    judges each on its own."""
    from layerwatch.engine.numerics.compare import compare_pair
    from layerwatch.engine.readers.base import ReaderUpdate
    from layerwatch.engine.records import TensorKey
    from support.toy_model import write_tensor

    rng = np.random.default_rng(1)
    g = rng.standard_normal((4, 16)).astype(np.float32)
    t = g + 1e-3 * rng.standard_normal((4, 16)).astype(np.float32)
    gloc = write_tensor(tmp_path / "g.bin", g, "float32")
    tloc = write_tensor(tmp_path / "t.bin", t, "float32")
    (tmp_path / "strict.toml").write_text(
        '[[override]]\nnode = "root.strict*"\ncosine_similarity = 0.9999999999\n'
    )
    calls: list[str] = []

    def counting(
        golden: TensorRecord, target: TensorRecord, thresholds: object, *, is_logits: bool = False
    ) -> object:
        calls.append(golden.key.node)
        return compare_pair(golden, target, thresholds, is_logits=is_logits)  # type: ignore[arg-type]

    records = [
        TensorRecord(TensorKey(0, node, "output"), "float32", (4, 16), gloc)
        for node in ("root.loose", "root.strict")
    ]
    session = CompareSession(thresholds=str(tmp_path / "strict.toml"), compare=counting)
    session.add_update(
        "golden",
        ReaderUpdate([TensorRecord(r.key, r.dtype, r.shape, gloc) for r in records], complete=True),
    )
    session.add_update(
        "target",
        ReaderUpdate([TensorRecord(r.key, r.dtype, r.shape, tloc) for r in records], complete=True),
    )
    session.flush()
    by_node = {r.key.node: r for r in session.results()}
    assert len(calls) == 1
    assert (
        by_node["root.loose"].verdict is Verdict.PASS
        and by_node["root.strict"].verdict is Verdict.FAIL
    )
    assert by_node["root.loose"].metrics == by_node["root.strict"].metrics
