"""The per-pair shortcuts of a small-tensor compare give what the step-by-step code gave:
report lines (``report.csv_line`` against ``csv.writer`` over ``csv_row``), a file's payloads
read at once (``load.load_flat_many`` against ``load_flat``, errors included), the store's
metric sets and pool a window at a time (against the pair-at-a-time loop it replaced), the
verdict's inline comparisons (against ``thresholds._within``), index statistics and the local
figure. Edge cases: NaN/Inf, -0.0, failing, unpaired, error and diverged pairs, text that
needs quoting."""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine import report
from layerwatch.engine.numerics.local import LocalFigure, LocalLimit, local_figure
from layerwatch.engine.numerics.thresholds import Thresholds, _within
from layerwatch.engine.readers.base import stats_from
from layerwatch.engine.readers.load import HELD, load_flat, load_flat_many
from layerwatch.engine.records import (
    COSINE,
    INPUT_ERR,
    LOCAL,
    MAX_ABS,
    MAX_REL,
    NORM_REL,
    RED,
    TOP1,
    Locator,
    PairResult,
    Stats,
    TensorKey,
    TensorRecord,
    Verdict,
    plain_stats,
)
from layerwatch.engine.session.store import ResultStore


# --- report lines ---------------------------------------------------------------------------
def _record(path: str, node: str = "root.a", stem: str = "output", **kw: object) -> TensorRecord:
    loc = Locator(path, 64, 64, "float32", (16,))
    return TensorRecord(TensorKey(3, node, stem), "float32", (16,), loc, **kw)  # type: ignore[arg-type]


def _results() -> list[PairResult]:
    g = _record("/d/g/data/0.safetensors", node_type="Linear")
    t = _record("/d/t/data/0.safetensors", node_type="Linear")
    odd = _record('/d/a,b "q"/x.pth', stats=Stats(1, -0.0, np.float64(0.1), 2.0))
    listed = TensorRecord(TensorKey(1, "n", "input_0"), "torch.bfloat16", [2, 3], None)  # type: ignore[arg-type]
    metrics = {COSINE: 0.5, MAX_REL: math.inf, MAX_ABS: math.nan, RED: -0.0, LOCAL: 1.5}
    return [
        PairResult(g.key, Verdict.PASS, {COSINE: 1.0, RED: 1e-07}, golden=g, target=t),
        PairResult(
            g.key,
            Verdict.FAIL,
            metrics,
            (COSINE, "max_relative_error"),
            'cos 0.5, "bad"\nsecond line',
            g,
            t,
            order=7,
            node_type='Lin,"ear"',
            golden_stats=Stats(1.5, -2.0, 0.25, 3.0),
            target_stats=Stats(np.float32(1.5), 2, 0.1, 3.0),  # type: ignore[arg-type]
        ),
        PairResult(g.key, Verdict.UNPAIRED, reason="only in the golden run, alone", golden=g),
        PairResult(t.key, Verdict.UNPAIRED, reason="only in the target run", target=odd),
        PairResult(g.key, Verdict.ERROR, reason="cannot compare: x\r\ny", golden=g, target=odd),
        PairResult(
            listed.key,
            Verdict.DIVERGED,
            {COSINE: np.float64(0.25), TOP1: 1, INPUT_ERR: 2.5e-300},
            reason="inputs differ (by itself: pass)",
            golden=listed,
            target=listed,
            order=-1,
        ),
    ]


def test_report_lines_are_the_bytes_csv_writer_writes() -> None:
    results = _results()
    reference = io.StringIO()
    writer = csv.writer(reference, lineterminator="\n")
    writer.writerow(report.CSV_COLUMNS)
    for data_id, result in enumerate(results, 5):
        writer.writerow(report.csv_row(result, data_id))
    for _ in range(2):  # the second time from the caches
        out = io.StringIO()
        assert report.write_csv(results, out, start=5) == len(results)
        assert out.getvalue() == reference.getvalue()
    assert '"Lin,""ear"""' in out.getvalue()  # quoted as csv quotes, not as-is


# --- payloads of one file -------------------------------------------------------------------
def _safetensors(path: Path, values: np.ndarray) -> int:
    """A file with a header and ``values`` after it; returns where the payloads start."""
    header = b'{"__metadata__":{}}   '
    path.write_bytes(struct.pack("<Q", len(header)) + header + values.tobytes())
    return 8 + len(header)


def _outcome(loc: Locator) -> object:
    try:
        return load_flat(loc)
    except LayerwatchError as exc:
        return str(exc)


def _same(got: list[np.ndarray | Exception], locs: list[Locator]) -> None:
    for have, loc in zip(got, locs, strict=True):
        want = _outcome(loc)
        if isinstance(want, str):
            assert isinstance(have, LayerwatchError) and str(have) == want
        else:
            assert isinstance(have, np.ndarray) and have.dtype == want.dtype  # type: ignore[attr-defined]
            np.testing.assert_array_equal(have, want)  # type: ignore[arg-type]


def test_payloads_read_together_are_what_one_at_a_time_reads(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    values = rng.standard_normal(64).astype(np.float32)
    values[3], values[9] = np.nan, -np.inf
    path = tmp_path / "a.safetensors"
    start = _safetensors(path, values)
    other = tmp_path / "b.safetensors"
    _safetensors(other, values[::-1].copy())
    locs = [
        Locator(str(path), start + 4 * i, 4 * n, dt, (n,))
        for i, n, dt in ((16, 8, "float32"), (0, 16, "float32"), (40, 24, "float32"))
    ]
    locs += [
        Locator(str(other), start, 32, "bfloat16", (16,)),  # bf16 halves of the floats
        Locator(str(other), start + 64, 64, "torch.float32", (4, 4)),
        Locator(str(path), start + 4 * 60, 64, "float32", (16,)),  # past the end: truncated
        Locator(str(path), 3, 16, "float32", (4,)),  # inside the header
        Locator(str(tmp_path / "gone.safetensors"), start, 16, "float32", (4,)),
        Locator(str(tmp_path / "gone.safetensors"), start + 16, 16, "float32", (4,)),
        Locator(str(path), start, 0, "float32", (0,)),  # empty
        Locator(str(path), start, 64, "float32", (4, 4), strides=(1, 4)),  # a view
    ]
    _same(load_flat_many(locs), locs)


def test_a_damaged_file_and_a_file_without_header_say_what_load_flat_says(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"not a safetensors file at all, just bytes" * 4)
    plain = tmp_path / "x.bin"
    plain.write_bytes(np.arange(32, dtype=np.float32).tobytes())
    locs = [Locator(str(path), 40 + 8 * i, 8, "float32", (2,)) for i in range(3)]
    locs += [Locator(str(plain), 8 * i, 8, "float32", (2,)) for i in range(5)]
    locs += [Locator(str(plain), 120, 16, "float32", (4,))]  # cut short
    _same(load_flat_many(locs), locs)


def test_far_apart_payloads_and_held_files_are_still_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from layerwatch.engine.readers import load

    monkeypatch.setattr(load, "SPAN_SLACK", 16)
    plain = tmp_path / "x.bin"
    data = np.arange(4096, dtype=np.float32)
    plain.write_bytes(data.tobytes())
    locs = [Locator(str(plain), at, 16, "float32", (4,)) for at in (0, 8000, 16)]
    _same(load_flat_many(locs), locs)  # a span mostly of other bytes: one at a time
    HELD.keep(str(plain) + ".held", data.tobytes())
    try:
        held = [Locator(str(plain) + ".held", at, 16, "float32", (4,)) for at in (0, 32)]
        got = load_flat_many(held)
        np.testing.assert_array_equal(got[0], data[:4])  # type: ignore[arg-type]
        assert isinstance(got[1], LayerwatchError)  # a held file is taken once (load_flat)
    finally:
        HELD.clear()


# --- the store's metric sets ----------------------------------------------------------------
def _reference_sets(results: list[PairResult]) -> tuple[list[tuple[object, ...]], list[float]]:
    """The pair-at-a-time loop of before: each pair's metric set and the pool it filled."""
    sets: dict[tuple[object, ...], int] = {}
    rows, pool = [], []
    for result in results:
        names = []
        for name, value in result.metrics.items():
            if value in (0.0, 1.0) and math.copysign(1.0, value) > 0:
                names.append((name, float(value)))
            else:
                names.append((name, None))
                pool.append(float(value))
        sets.setdefault(tuple(names), len(sets))
        rows.append(tuple(names))
    return rows, pool


def test_metric_sets_and_pool_match_the_pair_at_a_time_loop() -> None:
    rng = np.random.default_rng(1)
    key = TensorKey(0, "n", "output")
    choices = [0.0, -0.0, 1.0, -1.0, math.nan, math.inf, -math.inf, 0.5, 1, 0, True]
    results = []
    for i in range(300):
        names = ["a", "b", "c", "d"] if i % 7 else ["a", "logit_x", "b"]
        if i % 31 == 0:
            names = []
        metrics = {n: choices[int(rng.integers(len(choices)))] for n in names}
        results.append(PairResult(key, Verdict.PASS, metrics))
    sets, pool = _reference_sets(results)
    store = ResultStore()
    for at in range(0, len(results), 64):
        store.append(results[at : at + 64])
    first_use = list(dict.fromkeys(sets))
    assert store.metric_sets.values == first_use  # ids in order of first use, as before
    stored = np.concatenate([c for c in store._pool if c is not None])[: len(pool)]
    np.testing.assert_array_equal(stored, np.array(pool))
    for i, result in enumerate(results):
        got = store.metrics(i)
        assert list(got) == list(result.metrics)
        for name, value in result.metrics.items():
            assert struct.pack("<d", got[name]) == struct.pack("<d", float(value))


@pytest.mark.parametrize("columns", [1, 2, 14, 31, 32, 40])
def test_metric_patterns_packed_are_what_unique_rows_gives(columns: int) -> None:
    """The store's pattern search (``store._unique_rows``: rows of codes 0-2 packed into one
    integer each) gives ``np.unique(axis=0)``'s patterns, first rows and inverse; past 31
    columns it is ``np.unique(axis=0)`` itself."""
    from layerwatch.engine.session.store import _unique_rows

    rng = np.random.default_rng(columns)
    for rows in (1, 5, 300):
        kind = rng.integers(0, 3, (rows, columns)).astype(np.int8)
        kind[rows // 2 :] = kind[: rows - rows // 2]  # repeated rows
        kind[-1, -1] = 2  # the most significant code in the last column
        want = np.unique(kind, axis=0, return_index=True, return_inverse=True)
        got = _unique_rows(kind)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_array_equal(got[2], want[2].reshape(-1))
        assert got[0].dtype == want[0].dtype


# --- verdicts, statistics, local figure -----------------------------------------------------
@pytest.mark.parametrize("value", [0.999, 0.5, math.nan, 1.0, -1.0, 0.0, math.inf])
def test_the_inline_verdict_fails_the_metrics_within_fails(value: float) -> None:
    th = Thresholds.default()
    metrics = {COSINE: value, RED: value, MAX_REL: value, "one_thousandth_err_ratio": value}
    metrics |= {"nonfinite_mismatch": 0.0 if value == value else 1.0}
    for dtype in ("float32", "bfloat16", "float16", "int8"):
        _, limits, _ = th.limits_for(node="n", golden_dtype="float32", target_dtype=dtype)
        want = tuple(
            n
            for n, lim in limits.items()
            if n in metrics and not _within(n, metrics[n], lim, metrics, limits)
        )
        verdict, failed, _ = th.judge(metrics, node="n", golden_dtype="float32", target_dtype=dtype)
        assert failed == want
        assert verdict is (Verdict.FAIL if want else Verdict.PASS)


def test_limits_are_remembered_per_node_only_where_overrides_need_it(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text('[[override]]\nnode = "root.lm_head"\ncosine_similarity = 0.5\n')
    th = Thresholds.load(str(path))
    metrics = {COSINE: 0.6}
    assert (
        th.judge(metrics, node="root.lm_head", golden_dtype="float32", target_dtype="float32")[0]
        is Verdict.PASS
    )
    assert (
        th.judge(metrics, node="root.other", golden_dtype="float32", target_dtype="float32")[0]
        is Verdict.FAIL
    )
    assert (
        th.judge(metrics, node="root.lm_head", golden_dtype="float32", target_dtype="float32")[0]
        is Verdict.PASS
    )


@pytest.mark.parametrize(
    "values",
    [
        {"max": 1.5, "min": -2.0, "mean": 0.1, "norm": 3.0, "nan": 2, "inf": 1},
        {"max": 1.5, "min": -2.0, "mean": 0.1, "norm": 3.0},
        {"max": 1, "min": -2.0, "mean": 0.1, "norm": 3.0, "nan": 0, "inf": 0},
        {"max": "nan", "min": "-inf", "mean": 0.1, "norm": 3.0, "nan": 4, "inf": 0},
        {"Max": 1.0, "Min": 0.0, "Mean": 0.5, "L2Norm": 2.0},
        {"max": 1.0, "min": 0.0, "mean": 0.5, "norm": 2.0, "nan": 2**60 + 1, "inf": True},
    ],
)
def test_index_statistics_read_as_the_general_rules_read_them(values: dict[str, object]) -> None:
    def num(*keys: str) -> float:
        for k in keys:
            if values.get(k) is not None:
                return float(values[k])  # type: ignore[arg-type]
        return math.nan

    got = stats_from(values)
    assert got is not None
    want = (
        num("max", "Max"),
        num("min", "Min"),
        num("mean", "Mean"),
        num("norm", "Norm", "L2Norm"),
    )
    assert [struct.pack("<d", v) for v in (got.max, got.min, got.mean, got.norm)] == [
        struct.pack("<d", v) for v in want
    ]
    assert (got.nan, got.inf) == (
        int(num("nan")) if "nan" in values else 0,
        int(num("inf")) if "inf" in values else 0,
    )
    assert type(got.max) is float and type(got.nan) is int


@pytest.mark.parametrize(
    ("red_out", "nre_out", "red_in", "nre_in"),
    [
        (1e-6, 1e-7, 1e-7, 1e-8),
        (1e-7, 1e-6, 1e-7, 1e-8),
        (2e-7, 2e-7, 0.0, 0.0),
        (0.0, 0.0, 1e-7, 1e-7),
    ],
)
def test_local_figure_takes_the_larger_share_noise_on_a_tie(
    red_out: float, nre_out: float, red_in: float, nre_in: float
) -> None:
    limit = LocalLimit(red_gain=1.0, red=2.0, scale_gain=1.0, scale=2.0)
    fig = local_figure(
        {RED: red_out, NORM_REL: nre_out}, [{RED: red_in, NORM_REL: nre_in}], "fp32", limit
    )
    u = 2.0**-24
    noise, scale = (red_out - red_in) / u, (nre_out - nre_in) / u
    assert fig is not None
    assert fig.part == ("scale" if scale / 2.0 > noise / 2.0 else "noise")
    assert fig.ratio == max(noise, scale) / 2.0
    # built slot by slot (local._figure): the constructor's object
    part = fig.part
    share = scale if part == "scale" else noise
    want = LocalFigure(share / 2.0, red_in, part, share, 2.0, 1.0, "fp32")
    _same_frozen(fig, want)
    assert (
        local_figure({RED: math.nan, NORM_REL: 0.0}, [{RED: 0.0, NORM_REL: 0.0}], "fp32", limit)
        is None
    )
    assert (
        local_figure({RED: 0.0, NORM_REL: 0.0}, [{RED: math.inf, NORM_REL: 0.0}], "fp32", limit)
        is None
    )


def test_side_ids_remembered_give_each_pair_its_own_file_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from layerwatch.engine.session import store as store_module

    monkeypatch.setattr(store_module, "SIDE_IDS", 5)  # starts over many times
    results = []
    for token in range(4):
        for node in ("root.a", "root.b", "root.c"):
            loc = Locator(f"/d/cpu_1/{token}/{node}/output.pth", 64 * token, 64, "float32", (16,))
            shared = Locator("/d/data/0.safetensors", 64 * token, 64, "bfloat16", (4, 8))
            g = TensorRecord(TensorKey(token, node, "output"), "float32", (16,), loc)
            t = TensorRecord(TensorKey(token, node, "output"), "bfloat16", (4, 8), shared)
            results.append(PairResult(g.key, Verdict.PASS, {COSINE: 1.0}, golden=g, target=t))
    store = ResultStore()
    store.append(results[:5])
    store.append(results[5:])
    for i, result in enumerate(results):
        for side in ("golden", "target"):
            want = getattr(result, side)
            got = store.record(i, side)
            assert got is not None and got.loc is not None and want.loc is not None
            assert (got.loc.path, got.loc.offset, got.loc.nbytes, got.loc.dtype) == (
                want.loc.path,
                want.loc.offset,
                want.loc.nbytes,
                want.loc.dtype,
            )
            assert tuple(got.shape) == tuple(want.shape)


# --- a batch's metrics without an accumulator a pair ----------------------------------------
def _edge_pairs() -> list[tuple[np.ndarray, np.ndarray]]:
    """Pairs whose sums hit every branch: equal, zero (+0.0/-0.0), one side zero, far apart,
    NaN/Inf (redone by an accumulator), overflowing squares, denormals, 1e16, 0.1 + 0.2."""
    rng = np.random.default_rng(7)
    base = rng.standard_normal(16)
    rows = [
        (base, base),
        (base, base + 1e-7 * rng.standard_normal(16)),
        (np.zeros(4), np.zeros(4)),
        (np.full(4, -0.0), np.full(4, -0.0)),
        (np.zeros(4), base[:4]),
        (base[:8], -base[:8]),
        (np.array([1.0, np.nan, 2.0]), np.array([1.0, np.nan, 2.5])),
        (np.array([1.0, np.inf, -0.0]), np.array([1.0, 3.0, 0.0])),
        (np.array([1e300, 2e300]), np.array([1e300, 2.5e300])),
        (np.array([5e-324, -5e-324, 1e-310]), np.array([1e-320, 0.0, 1e-310])),
        (np.array([1e16, 1e-5, 0.1 + 0.2]), np.array([1e16 + 2, 1e-5, 0.3])),
        (np.array([np.nan, np.nan]), np.array([np.nan, 1.0])),
    ]
    return [(g.astype(np.float64), t.astype(np.float64)) for g, t in rows]


@pytest.mark.parametrize("side_stats", [False, True])
def test_small_results_are_what_an_accumulator_a_pair_gives(side_stats: bool) -> None:
    from layerwatch.engine.numerics.segments import small_accumulators, small_results

    pairs = _edge_pairs()
    for floor in (1e-6, 1.0):
        got = small_results(pairs, floor, side_stats=side_stats)
        want = small_accumulators(pairs, floor, side_stats=side_stats)
        for (metrics, stats), acc in zip(got, want, strict=True):
            # repr: the report's text, which tells -0.0 from 0.0 and compares NaN as text
            assert repr(metrics) == repr(acc.result())
            assert repr(stats) == repr(acc.side_stats() if side_stats else None)


def _same_frozen(got: object, want: object) -> None:
    """``got`` (slot setters) is the frozen dataclass object the constructor made: equal,
    same hash, text and field types, frozen, pickled alike."""
    assert type(got) is type(want)
    assert got == want and hash(got) == hash(want) and repr(got) == repr(want)
    for f in dataclasses.fields(want):  # type: ignore[arg-type]
        assert type(getattr(got, f.name)) is type(getattr(want, f.name))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(got, dataclasses.fields(want)[0].name, 1.0)  # type: ignore[arg-type]
    assert pickle.loads(pickle.dumps(got)) == want


@pytest.mark.parametrize(
    "values",
    [
        (1.5, -2.0, 0.25, 3.0, 0, 0),
        (-0.0, 0.0, 5e-324, 1e308, 7, 1 << 60),
        (2.0, 1.0, 1.5, 2.5, 1, 2),
    ],
)
def test_plain_stats_is_the_constructors(values: tuple) -> None:
    _same_frozen(plain_stats(*values), Stats(*values))


def test_a_new_result_by_position_is_the_keyword_ones() -> None:
    """``compare._new_result`` passes every field up to ``is_logits`` by position."""
    from layerwatch.engine.numerics.compare import _new_result

    g = _record("/g.safetensors", node_type="")
    t = _record("/t.safetensors", node_type="Linear")
    for is_logits in (False, True):
        got = _new_result(g, t, is_logits)
        want = PairResult(
            key=g.key, verdict=Verdict.ERROR, golden=g, target=t, node_type="Linear",
            is_logits=is_logits,
        )  # fmt: skip
        assert got == want and repr(got) == repr(want)
        assert got.metrics == {} and got.metrics is not _new_result(g, t, is_logits).metrics
