"""The session's answer does not depend on the order things arrive in (hypothesis shuffles it).

Tensors of both runs, both topologies, the input ids of every token and some duplicates arrive
in a random order, in random batches, with flushes at random points; the results, first
failure, root cause, first bad token and grid must equal those of an all-at-once session, and
the cell updates streamed to the sink must add up to the same grid.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from layerwatch.engine.readers.base import ReaderUpdate
from layerwatch.engine.seam import CellUpdate, QueueSink
from layerwatch.engine.session.cells import same_cell
from layerwatch.engine.session.core import CompareSession
from support.sessions import finished_session
from support.toy_model import META_TYPES, Fault, ToyModel, ToyRun, meta_names, renamed


@pytest.fixture(scope="module")
def scenarios(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[ToyRun, ToyRun, dict[str, object]]]:
    base: Path = tmp_path_factory.mktemp("order")
    model = ToyModel(layers=2, hidden=16, vocab=31, seed=3)
    golden = model.run(base / "g")
    forced = {t: golden.token_ids[t][0] for t in range(1, 4)}
    faulty = model.run(
        base / "f", fault=Fault("root.model.layers.1.mlp.up_proj", start=1, noise=0.3), feed=forced
    )
    forced_div = dict(forced)
    forced_div[2] = (forced[2] + 5) % model.vocab
    diverged = model.run(
        base / "d",
        fault=Fault("root.model.layers.0.self_attn.o_proj", start=1, noise=0.2),
        feed=forced_div,
    )
    meta = renamed(model.run(base / "m", dtype="bfloat16", feed=forced), meta_names(2), META_TYPES)
    return {
        "fault": (golden, faulty, {}),
        "diverged": (golden, diverged, {}),
        "auto-map": (golden, meta, {"auto_map": True}),
    }


def _reference(golden: ToyRun, target: ToyRun, kwargs: dict[str, object]) -> CompareSession:
    return finished_session(golden.update(), target.update(), **kwargs)


def _fingerprint(session: CompareSession) -> list[tuple[object, ...]]:
    return [
        (
            r.key,
            r.verdict,
            r.reason,
            r.failed,
            repr(sorted(r.metrics.items())),
            r.order,
            r.block,
            r.is_logits,
            r.target.key if r.target else None,
        )
        for r in session.results()
    ]


def _events(golden: ToyRun, target: ToyRun) -> list[tuple[str, object]]:
    events: list[tuple[str, object]] = [("golden", r) for r in golden.records] + [
        ("target", r) for r in target.records
    ]
    events += [("golden", golden.topology), ("target", target.topology)]
    events += [("golden", (t, ids)) for t, ids in golden.token_ids.items()]
    events += [("target", (t, ids)) for t, ids in target.token_ids.items()]
    return events


def _deliver(session: CompareSession, side: str, items: list[object]) -> None:
    update = ReaderUpdate()
    for item in items:
        if isinstance(item, tuple):
            update.token_ids[item[0]] = item[1]
        elif hasattr(item, "nodes"):
            update.topology = item  # type: ignore[assignment]
        else:
            update.tensors.append(item)  # type: ignore[arg-type]
    session.add_update(side, update)


def _replay(sink: QueueSink) -> dict[tuple[int, int], CellUpdate]:
    grid: dict[tuple[int, int], CellUpdate] = {}
    for batch in sink.drain():
        if batch.blocks is not None:
            grid.clear()
        for cell in batch.cells:
            if cell.pairs == 0 and cell.state.name == "EMPTY":
                grid.pop((cell.token, cell.block), None)
            else:
                grid[(cell.token, cell.block)] = cell
    return grid


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fault", "diverged", "auto-map"])
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_arrival_order_does_not_matter(
    scenarios: dict[str, tuple[ToyRun, ToyRun, dict[str, object]]], name: str, data: st.DataObject
) -> None:
    golden, target, kwargs = scenarios[name]
    reference = _reference(golden, target, kwargs)
    events = _events(golden, target)
    duplicates = data.draw(st.lists(st.sampled_from(events), max_size=20), label="duplicates")
    order = data.draw(st.permutations(events + duplicates), label="order")
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(order)), max_size=12), label="cuts")))
    flushes = set(data.draw(st.lists(st.integers(0, len(cuts)), max_size=6), label="flushes"))
    sink = QueueSink()
    session = CompareSession(sink=sink, **kwargs)  # type: ignore[arg-type]
    start = 0
    for i, end in enumerate([*cuts, len(order)]):
        chunk = order[start:end]
        start = end
        for side in ("golden", "target"):
            items = [item for s, item in chunk if s == side]
            if items:
                _deliver(session, side, items)
        if i in flushes:
            session.flush()
    for side in data.draw(st.permutations(["golden", "target"]), label="finish"):
        session.finish(side)
    session.flush()

    assert _fingerprint(session) == _fingerprint(reference)
    assert session.first_failure == reference.first_failure
    assert session.root_cause == reference.root_cause
    assert session.first_bad_token == reference.first_bad_token
    assert session.summary == reference.summary
    assert session.blocks() == reference.blocks()
    cells, expected = session.cells(), reference.cells()
    assert cells.keys() == expected.keys()
    assert all(same_cell(cells[k], expected[k]) for k in cells)
    streamed = _replay(sink)
    assert streamed.keys() == cells.keys()
    assert all(same_cell(streamed[k], cells[k]) for k in cells)


def test_scenarios_are_meaningful(
    scenarios: dict[str, tuple[ToyRun, ToyRun, dict[str, object]]],
) -> None:
    """Guard against a vacuous property: each scenario has a failure, divergence or mapping to get right."""
    fault = _reference(*scenarios["fault"])
    assert fault.root_cause is not None and fault.root_cause.node.endswith("1.mlp.up_proj")
    diverged = _reference(*scenarios["diverged"])
    assert diverged.summary.diverged > 0 and diverged.first_failure is not None
    mapped = _reference(*scenarios["auto-map"])
    assert mapped.summary.pairs > 0.9 * len(scenarios["auto-map"][0].records)
    assert mapped.first_failure is None
