"""The live session's shortcuts on many small pairs (engine/session/settled.py, store.py,
core.py), each held to the rule or the code it replaces."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from layerwatch.engine.records import PairResult, TensorKey, Verdict
from layerwatch.engine.session import settled
from layerwatch.engine.session.core import CompareSession
from layerwatch.engine.session.store import ResultStore
from support.toy_model import ToyRun


def _narrow(value: object) -> bool:
    """The rule a value at a time, as it was: float32 holds it exactly (NaN and ±inf too)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # np.float32 of 1e300 warns
        return value != value or float(np.float32(value)) == value  # type: ignore[arg-type]


EDGES = [
    0.1,
    -0.0,
    1.5,
    1e300,
    -1e300,
    math.inf,
    -math.inf,
    math.nan,
    5e-324,
    1e-45,
    3.4028235e38,
    3.4028236e38,
    float(np.float32(3.4028235e38)),
    float(np.float32(0.1)),
    np.float32(0.1),
    2**24,
    2**24 + 1,
    2**53 + 1,
    2**60 + 1,
    3,
]


def test_wide_rows_are_the_rows_a_value_at_a_time_rule_finds_without_a_warning() -> None:
    rows = [
        (0, -1, a, b, c, d, 0.0, 0.0)
        for a in EDGES
        for b in EDGES[::3]
        for c in (1.0, 1e300)
        for d in EDGES[::5]
    ]
    want = [i for i, row in enumerate(rows) if not all(_narrow(v) for v in row[2:6])]
    assert 0 < len(want) < len(rows)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the old scalar cast printed an overflow warning
        assert settled._wide_rows(rows) == want
    assert settled._wide_rows([]) == []


def test_index_of_finds_the_object_itself_not_an_equal_one() -> None:
    key = TensorKey(0, "n", "output")
    a, b = PairResult(key, Verdict.FAIL, {"x": 1.0}), PairResult(key, Verdict.FAIL, {"x": 1.0})
    assert a == b
    assert settled._index_of([a, b], b) == 1 and settled._index_of([a, b], a) == 0


def _results() -> list[PairResult]:
    """Pairs of several metric sets: names missing, values exactly +0.0 and 1.0 (kept in the
    set, not the pool), -0.0, NaN."""
    sets = [
        {"a": 0.5, "b": 0.0, "c": 1.0},
        {"a": -0.0, "c": 0.25},
        {"b": math.nan, "d": 1.0},
        {},
        {"a": 0.0, "b": 1.0, "c": 0.0},
    ]
    rng = np.random.default_rng(3)
    out = []
    for i in range(300):
        metrics = dict(sets[i % len(sets)])
        if i % 7 == 0:
            metrics = {k: float(rng.random()) if v == 0.5 else v for k, v in metrics.items()}
        out.append(PairResult(TensorKey(i, f"n{i}", "output"), Verdict.PASS, metrics))
    return out


@pytest.mark.parametrize("far", [False, True], ids=["together", "far-apart"])
def test_metric_lists_are_the_values_of_each_rows_metric_dict(far: bool) -> None:
    """Rows read together take the block path; rows far apart in the pool (more than
    ``_span``'s slack between them) are read a row at a time, as before."""
    results = _results()
    store = ResultStore()
    store.append(results)
    if far:  # many pooled values between the rows read
        filler = [PairResult(TensorKey(0, "f", "output"), Verdict.PASS, {"z": 0.3})] * 6000
        store.append(filler)
        store.append(results)
        picked = [*range(0, 40), *range(len(results) + 6000, len(results) + 6040)]
        rows = np.concatenate([store.rows_between(i, i + 1) for i in picked])
        assert store._span(store.columns(rows))[2] is None
    else:
        rows = store.rows_between(0, len(results))
    col = store.columns(rows)
    names = ("a", "b", "c", "d", "e")
    got = store.metric_lists(col, names)
    want = [[d.get(name) for name in names] for d in store.metric_dicts(col)]
    assert len(got) == len(want) == len(rows)
    assert repr(got) == repr(want)  # -0.0, NaN and None as they were; Python floats
    assert all(type(v) is float for row in got for v in row if v is not None)
    assert store.metric_lists(store.columns(store.rows_between(0, 0)), names) == []


def test_a_batchs_changed_pairs_come_in_the_order_the_lambda_sorted_them(
    toy_runs: dict[str, ToyRun],
) -> None:
    """Golden keys only (the fast path: paired, and unpaired ones through ``_result_of``) and
    mixed with target keys (the sort of before), each against the (token, node, stem, tag)
    sort and ``_result_of`` a member."""
    session = CompareSession(jobs=1)
    golden = toy_runs["golden"].update()
    target = toy_runs["faulty"].update()
    dropped = {r.key for r in target.tensors[::9]}
    target.tensors = [r for r in target.tensors if r.key not in dropped]
    session.add_update("golden", golden)
    session.add_update("target", target)
    session.finish("golden")
    session.finish("target")
    session.flush(batch=False)

    def reference() -> list[PairResult]:
        members = sorted(session._changed, key=lambda m: (m[1].token, m[1].node, m[1].stem, m[0]))
        return [r for t, k in members if (r := session._result_of(t, k)) is not None]

    keys = [r.key for r in golden.tensors]
    session._changed.clear()
    session._changed.update(("g", k) for k in keys)
    want = reference()
    assert len(want) == len(keys) and any(r.verdict is Verdict.UNPAIRED for r in want)
    assert session._changed_results() == want
    session._changed.update(("t", r.key) for r in target.tensors[:40])
    assert {t for t, _ in session._changed} == {"g", "t"}
    assert session._changed_results() == reference()
