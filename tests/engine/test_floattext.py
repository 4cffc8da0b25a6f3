"""A report's numbers formatted in bulk (``engine/floattext.py``) are the bytes the standard
library writes: each CSV cell ``repr`` of the float (``nan``, ``inf``, ``-0.0``; empty for
None), each JSON row ``json``'s (non-finite metrics as null). Over the edge cases (subnormals,
the largest float, the decades where ``repr`` turns scientific, numpy scalars, ints), over
millions of random bit patterns and values across decades, and with orjson taken away."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
from layerwatch.engine import floattext, orjson_lazy, report

EDGES: list[float] = [
    0.0,
    -0.0,
    5e-324,
    -5e-324,
    2.2250738585072014e-308,  # the smallest normal
    2.225073858507201e-308,  # the largest subnormal
    sys.float_info.max,
    -sys.float_info.max,
    math.nan,
    -math.nan,
    math.inf,
    -math.inf,
    1.0,
    -1.0,
    3.0,
    123456789012345.0,
    1234567890123456.0,
    9007199254740993.0,
    0.1,
    1 / 3,
    100.00001,
    -100.00001,
    10.00005,
    0.00010000000000000002,
]
for _exp in (-10, -9, -7, -6, -5, -4, -3, 15, 16, 17, 22, 100, -100, 300, -300, -307, -308):
    for _scale in (1.0, 1.234, 9.99, 5.0):
        _v = _scale * 10.0**_exp
        for _w in (_v, math.nextafter(_v, 0.0), math.nextafter(_v, math.inf)):
            EDGES += [_w, -_w]


def _reference(values: list[object]) -> list[str]:
    return ["" if v is None else repr(float(v)) for v in values]  # type: ignore[arg-type]


def _without_orjson(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a box where orjson cannot be imported."""
    monkeypatch.setattr(orjson_lazy, "_TRIED", True)
    monkeypatch.setattr(orjson_lazy, "_orjson", None)


@pytest.fixture(params=["orjson", "standard library"])
def formatter(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here runs with orjson (for blocks of any size) and with the fallback of a box
    without it."""
    if request.param == "orjson":
        monkeypatch.setattr(floattext, "_BULK", 0)
        assert floattext._bulk(1) is not None, "orjson is a dependency (pyproject.toml)"
    else:
        _without_orjson(monkeypatch)
    return str(request.param)


def test_edge_cases_are_repr(formatter: str) -> None:
    values: list[object] = [*EDGES, None, None]
    assert floattext.cells(values) == _reference(values)
    assert floattext.cells([]) == []
    for v in values:  # one at a time: the text can start and end at any cell
        assert floattext.cells([v]) == _reference([v]), v
        assert floattext.cells([v, None, v]) == _reference([v, None, v]), v


def test_runs_are_their_cells_joined(formatter: str) -> None:
    """cell_runs (a CSV line's numbers as three runs, report.field_lines) gives each run's
    cells joined by ",": edge values at a run's first and last place, Nones, NaN/Inf among
    Nones, a run of Nones and a numpy scalar in the block."""
    values: list[object] = [*EDGES, None, math.nan, None, -math.inf]
    runs: list[object] = [tuple(values[at : at + 3]) for at in range(0, len(values) - 2, 2)]
    runs += [(None, None, None), [1e-05, 2.5e-07, None], (1e-07,)]
    want = [",".join(_reference(list(run))) for run in runs]
    assert floattext.cell_runs(runs) == want
    finite_runs = [r for r in runs if all(v is None or math.isfinite(v) for v in r)]
    assert floattext.cell_runs(finite_runs) == [",".join(_reference(list(r))) for r in finite_runs]
    no_nones = [r for r in finite_runs if None not in r]
    assert floattext.cell_runs(no_nones) == [",".join(_reference(list(r))) for r in no_nones]
    mixed = [*runs[:3], (np.float32(0.1), 3, None)]
    assert floattext.cell_runs(mixed) == [",".join(_reference(list(r))) for r in mixed]


def test_numpy_scalars_ints_and_bools_are_written_as_float(formatter: str) -> None:
    values: list[object] = [
        np.float64(1e-05),
        np.float64(-0.0),
        np.float32(0.1),  # its float64 value: 0.10000000149011612
        np.float32(1e-07),
        np.float16(65504),
        np.int64(7),
        3,
        -2,
        True,
        False,
        None,
        1.234e-05,
        math.nan,
    ]
    assert floattext.cells(values) == _reference(values)
    assert floattext.cells(values)[2] == "0.10000000149011612"


def test_a_million_random_bit_patterns_are_repr() -> None:
    """Every float64 bit pattern is as likely: NaNs, subnormals, both signs, every exponent
    (``tests/bench/bench_floattext.py --check`` runs 10 M and more; ~3 s a million here)."""
    rng = np.random.default_rng(20)
    values = rng.integers(0, 2**64, 1_000_000, dtype=np.uint64).view(np.float64).tolist()
    assert floattext.cells(values) == list(map(repr, values))


def test_a_million_values_across_decades_are_repr() -> None:
    """Where the texts differ: mantissas of every length around each power of ten from 1e-12
    to 1e20 (the report's metrics live there), with None between them."""
    rng = np.random.default_rng(16)
    mantissa = rng.uniform(1.0, 10.0, 1_000_000)
    exponent = rng.integers(-12, 21, 1_000_000)
    sign = rng.choice([-1.0, 1.0], 1_000_000)
    arr = sign * mantissa * 10.0 ** exponent.astype(np.float64)
    arr[::7] = np.round(arr[::7], 3)  # short texts too
    values: list[object] = arr.tolist()
    values[::11] = [None] * len(values[::11])
    assert floattext.cells(values) == _reference(values)


def _row(metrics: dict[str, object], reason: str = "", node: str = "root.a") -> dict[str, object]:
    return {
        "token": 1,
        "node": node,
        "tensor": "output",
        "rank": 0,
        "verdict": "pass",
        "metrics": metrics,
        "reason": reason,
    }


def _json_reference(rows: list[dict[str, object]], sep: bytes) -> bytes:
    return sep.join(
        report.dumps_json({**row, "metrics": report.finite(row["metrics"])}).encode()  # type: ignore[arg-type]
        for row in rows
    )


@pytest.mark.parametrize("sep", [b",", b"\n"])
def test_json_rows_are_what_json_writes(formatter: str, sep: bytes) -> None:
    finite = [v for v in EDGES if math.isfinite(v)]
    rows = [
        _row({"cosine_similarity": v, "max_relative_error": -v, "nan_golden": 0.0}) for v in finite
    ]
    rows += [
        _row({}),
        _row({"a": math.nan, "b": math.inf, "c": -math.inf, "d": 1e-07}),
        _row({"count": 3, "top1_agreement": True, "big": 2**70}),  # an int beyond orjson's range
        _row({"x": np.float64(1e-05), "y": np.float64(math.nan)}),  # numpy scalars: json's rules
        _row({"x": 1e-07}, reason="1.1× the allowance (input RED 5.1e-08)"),  # non-ASCII
        _row({"x": 1e-07}, reason='a "quoted" \\ path\n\x01\x7f', node="e-1,:0.00001}"),
        _row({"key:1e-7,": 1e-07, "k}": 2e-05}),  # keys the fix-ups must not touch
        _row({"x": 2e-05}, reason="1e-7,0.00002}", node="root.e-7"),
    ]
    want = _json_reference([dict(r) for r in rows], sep)
    kept = [dict(r["metrics"]) for r in rows]  # type: ignore[arg-type]
    assert floattext.json_rows(rows, sep) == want
    assert [r["metrics"] for r in rows] == kept  # the rows' own metrics are put back
    for row in rows:  # a row alone: its own block
        assert floattext.json_rows([dict(row)], sep) == _json_reference([dict(row)], sep)
    assert floattext.json_rows([], sep) == b""


def test_many_json_rows_of_random_metrics_are_what_json_writes(formatter: str) -> None:
    rng = np.random.default_rng(12)
    arr = rng.uniform(1.0, 10.0, 200_000) * 10.0 ** rng.integers(-12, 18, 200_000).astype(float)
    values = arr.tolist()
    names = [f"metric_{i}" for i in range(20)]
    rows = [_row(dict(zip(names, values[i : i + 20], strict=True))) for i in range(0, 200_000, 20)]
    assert floattext.json_rows(rows, b",") == _json_reference(rows, b",")


def test_report_writers_give_the_same_bytes_without_orjson(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CSV lines and JSON rows of the pair-rate test's results, with and without orjson."""
    from tests.engine.test_pair_rate_paths import _results

    monkeypatch.setattr(floattext, "_BULK", 0)
    results = _results()
    fast = (
        report.field_lines([report.line_fields(r) for r in results], 3),
        report.json_lines(results, b","),
    )
    want_json = ",".join(report.dumps_json(report.json_row(r)) for r in results).encode()
    assert fast[1] == want_json
    _without_orjson(monkeypatch)
    slow = (
        report.field_lines([report.line_fields(r) for r in results], 3),
        report.json_lines(results, b","),
    )
    assert fast == slow


def test_a_small_block_is_written_value_by_value_a_large_one_by_orjson() -> None:
    """Below ``_BULK`` numbers orjson is not even imported (a compare that writes no report
    does not pay for its import); the text is the same either way."""
    small = [1e-07, None, 1.234e-05] * 10
    assert floattext._bulk(len(small)) is None
    assert floattext.cells(small) == _reference(small)
    big = small * (floattext._BULK // len(small) + 1)
    assert floattext._bulk(len(big)) is not None
    assert floattext.cells(big) == _reference(big)
