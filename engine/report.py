"""Reports of a finished (or live) comparison: msit-compatible CSV, the ``--json`` object, JSON lines.

CSV: msit's 24 columns in msit's order (``CSV_GOLDEN_HEADER``; dtypes written as msit writes
them, ``torch.float32``; shapes as ``[1, 16, 256]``), then ours: ``verdict, failed_metrics,
reason, node_type, exec_order``. Rows in report order (token, then execution order); a metric
that does not apply, or a statistic the dump did not record, is an empty cell. Unlike msit,
pairs that could not be compared (shape mismatch, unreadable) and unpaired tensors stay in the
report, with the reason. The CSV holds pairs only, no run-level line (a reader of msit's CSV
takes every line as a pair): the divergence record is in the JSON / JSON lines and in the
printed summary; in the CSV the pairs it left unjudged read ``diverged``.

JSON (``layerwatch compare --json``, ``-o report.json``; keep these names stable)::

    {"summary": {"pairs", "pass", "fail", "diverged", "unpaired", "error"},
     "first_failure": null | {"token", "node", "tensor", "rank", "verdict", "failed_metrics", "metrics"},
     "root_cause": null | (same shape),
     "first_bad_token": int | null,
     "divergence": null | {"token", "golden_id", "target_id", "golden_margin", "near_tie",
                           "not_compared": {"tokens": [int, ...], "pairs": int}},
     "notes": [str, ...],  (only when a reader noted damaged input: an index or dump.json cut
                            short, a file skipped — a compare of part of what was meant)
     "rows": [{"token", "node", "tensor", "rank", "verdict", "metrics", "reason"}, ...]}

``summary.pairs`` counts compared pairs (pass + fail + diverged + error); unpaired tensors are
counted apart. Non-finite metric values (an infinite relative error) are written as ``null``
so the output stays strict JSON. JSON lines (``-o report.jsonl``): each row on its own line, then
one line with the other keys. Parquet (``-o report.parquet``): the JSON rows as a table (one
float64 column per metric; the other keys of the JSON object as the file's ``layerwatch`` metadata),
written a row group per window of tokens; pandas reads it (``pandas.read_parquet``). A report cut short (Ctrl-C, a full
disk) keeps its rows and says so: the JSON object and the JSONL last line get
``"incomplete": "<why>"``, the CSV a last line ``# incomplete: <why>``. Which file gets which format, and the exit codes, are
engine/outcome.py's.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

from layerwatch.engine.floattext import ENCODER, cell, cell_runs, finite, json_rows
from layerwatch.engine.records import (
    EXACT,
    FIVE_THOUSANDTHS,
    INF_GOLDEN,
    INF_TARGET,
    INPUT_ERR,
    LOCAL,
    MARGIN,
    MSIT_METRICS,
    NAN_GOLDEN,
    NAN_MISMATCH,
    NAN_TARGET,
    NORM_REL,
    ONE_THOUSANDTH,
    STAT_METRICS,
    TOP1,
    TOPK,
    PairResult,
    Stats,
    TensorRecord,
)
from layerwatch.engine.seam import Divergence, Finding, Summary

MSIT_COLUMNS = (
    "token_id",
    "data_id",
    "golden_data_path",
    "golden_op_type",
    "golden_dtype",
    "golden_shape",
    "golden_max_value",
    "golden_min_value",
    "golden_mean_value",
    "my_data_path",
    "my_op_type",
    "my_dtype",
    "my_shape",
    "my_max_value",
    "my_min_value",
    "my_mean_value",
    *MSIT_METRICS,
    "cmp_fail_reason",
)
"""msit 8.2.0 ``CSV_GOLDEN_HEADER``, in its order."""
OUR_COLUMNS = (
    "verdict",
    "failed_metrics",
    "reason",
    "node_type",
    "exec_order",
    LOCAL,
    INPUT_ERR,
)
CSV_COLUMNS = MSIT_COLUMNS + OUR_COLUMNS


def _side(record: TensorRecord | None, computed: Stats | None = None) -> list[str]:
    """msit's 7 columns of one side; statistics from the record, else from the compare pass."""
    if record is None:
        return [""] * 7
    stats = record.stats or computed
    dtype = record.dtype if record.dtype.startswith("torch.") else f"torch.{record.dtype}"
    return [
        record.source or (record.loc.path if record.loc else ""),
        record.node_type,
        dtype,
        str(list(record.shape)),
        cell(stats.max) if stats else "",
        cell(stats.min) if stats else "",
        cell(stats.mean) if stats else "",
    ]


def csv_row(result: PairResult, data_id: int) -> list[str]:
    metrics = result.metrics
    verdict = result.verdict.value
    fail_reason = result.reason if verdict in ("error", "unpaired") else ""
    return [
        str(result.key.token),
        str(data_id),
        *_side(result.golden, result.golden_stats),
        *_side(result.target, result.target_stats),
        *(cell(metrics.get(name)) for name in MSIT_METRICS),
        fail_reason,
        verdict,
        ";".join(result.failed),
        result.reason,
        result.node_type,
        str(result.order),
        cell(metrics.get(LOCAL)),
        cell(metrics.get(INPUT_ERR)),
    ]


def write_csv(
    results: Iterable[PairResult], out: TextIO, *, header: bool = True, start: int = 0
) -> int:
    """Write the header and one row per result, ``data_id`` from ``start`` (a report written a
    window at a time goes on where the last one ended); returns the number of rows. Rows are
    :func:`csv_line`'s: the bytes ``csv.writer`` writes for :func:`csv_row`, at a third of the
    CPU (a small-tensor compare spent a fifth of its time here)."""
    if header:
        csv.writer(out, lineterminator="\n").writerow(CSV_COLUMNS)
    fields = [line_fields(result) for result in results]
    out.write(field_lines(fields, start))
    return len(fields)


_QUOTED: dict[str, str] = {}
"""Text that needs quoting → its quoted form, as ``csv.writer`` writes it."""
_SIDE_TEXT: dict[tuple[Any, ...], str] = {}
"""(path, node type, dtype, shape) → a side's first four CSV cells: they repeat on every token."""
_CACHE_LIMIT = 4096
"""Entries of each cache before it starts over: per-tensor files (msit, ATB) never repeat a
path, and the caches must not grow with the pairs."""


def _field(text: str) -> str:
    """``text`` as one CSV cell of ``csv.writer(lineterminator="\\n")`` (minimal quoting): as
    it is unless it holds a delimiter, a quote or a line break, then the csv module quotes it."""
    if "," in text or '"' in text or "\n" in text or "\r" in text:
        found = _QUOTED.get(text)
        if found is None:
            buf = io.StringIO()
            csv.writer(buf, lineterminator="\n").writerow([text, ""])
            found = buf.getvalue()[:-2]  # less the empty last cell's "," and the line end
            if len(_QUOTED) >= _CACHE_LIMIT:
                _QUOTED.clear()
            _QUOTED[text] = found
        return found
    return text


def side_head(path: str, node_type: str, dtype: str, shape: Any) -> str:
    """A side's first four CSV cells (path, op type, dtype as ``torch.<dtype>``, shape), joined,
    from a cache: they repeat on every token."""
    key: tuple[Any, ...] | None = (path, node_type, dtype, shape)
    try:
        head = _SIDE_TEXT.get(key)  # type: ignore[arg-type]
    except TypeError:  # a shape given as a list
        key, head = None, None
    if head is None:
        torch_dtype = dtype if dtype.startswith("torch.") else f"torch.{dtype}"
        head = ",".join(_field(cell) for cell in (path, node_type, torch_dtype, str(list(shape))))
        if key is not None:
            if len(_SIDE_TEXT) >= _CACHE_LIMIT:
                _SIDE_TEXT.clear()
            _SIDE_TEXT[key] = head
    return head


def _side_fields(record: TensorRecord, stats: Stats | None) -> tuple[Any, ...]:
    return (
        record.source or (record.loc.path if record.loc else ""),
        record.node_type,
        record.dtype,
        record.shape,
        None if stats is None else (stats.max, stats.min, stats.mean),
    )


NO_HEAD = ",,,"
"""A missing side's first four cells (its statistics are three empty cells)."""
_NO_STATS = (None, None, None)
LINE_METRICS = (*MSIT_METRICS, LOCAL, INPUT_ERR)
"""The metrics a CSV line writes, in its order."""


def line_fields(result: PairResult) -> tuple[Any, ...]:
    """A result's report line as :func:`field_lines` takes it (``settled.line_fields``'s
    layout)."""
    get = result.metrics.get
    golden, target = result.golden, result.target
    return (
        result.key.token,
        None if golden is None else _side_fields(golden, golden.stats or result.golden_stats),
        None if target is None else _side_fields(target, target.stats or result.target_stats),
        list(map(get, LINE_METRICS)),
        result.verdict.value,
        result.failed,
        result.reason,
        result.node_type,
        result.order,
    )


def csv_line(result: PairResult, data_id: int) -> str:
    """One report line: the cells of :func:`csv_row` as ``csv.writer`` writes them, ending in
    ``\\n`` (the same bytes, ``tests/engine/test_pair_rate_paths.py``)."""
    return field_lines([line_fields(result)], data_id)


def field_lines(rows: Iterable[tuple[Any, ...]], first_id: int) -> str:
    """CSV lines of rows given as their fields (:func:`line_fields`, ``settled.line_fields``:
    token, each side as (path, op type, dtype, shape, (max, min, mean) or None) or None, the
    values of :data:`LINE_METRICS` (None: not measured), verdict, failed metrics, reason, op
    type, order), ``data_id`` from ``first_id``: the bytes ``csv.writer`` writes for
    :func:`csv_row`, without a call a cell; every number of the block is formatted at once."""
    rows = rows if isinstance(rows, list) else list(rows)
    runs: list[Any] = []  # a line's numbers as three runs: each side's statistics, its metrics
    for _, golden, target, values, *_ in rows:
        runs += (
            _NO_STATS if golden is None else golden[4] or _NO_STATS,
            _NO_STATS if target is None else target[4] or _NO_STATS,
            values,
        )
    text = cell_runs(runs)
    out = []
    at = 0
    for data_id, (token, golden, target, _, verdict, failed, reason, node_type, order) in enumerate(
        rows, first_id
    ):
        reason = _field(reason)
        ghead = NO_HEAD if golden is None else side_head(golden[0], golden[1], golden[2], golden[3])
        thead = NO_HEAD if target is None else side_head(target[0], target[1], target[2], target[3])
        msit, local, input_err = text[at + 2].rsplit(",", 2)
        out.append(
            f"{token!s},{data_id},{ghead},{text[at]},{thead},{text[at + 1]},{msit},"
            f"{reason if verdict in ('error', 'unpaired') else ''},{_field(verdict)},"
            f"{_field(';'.join(failed))},{reason},{_field(node_type)},"
            f"{order!s},{local},{input_err}\n"
        )
        at += 3
    return "".join(out)


def _finding(finding: Finding | None) -> dict[str, Any] | None:
    if finding is None:
        return None
    out = finding.to_json()
    out["metrics"] = finite(finding.metrics)
    return out


def json_row(result: PairResult) -> dict[str, Any]:
    """One ``rows`` entry of the ``--json`` object."""
    row = result.to_json()
    row["metrics"] = finite(result.metrics)
    return row


def json_lines(results: Sequence[PairResult], sep: bytes) -> bytes:
    """The :func:`json_row` of each result as :func:`dumps_json` writes it, joined by ``sep``:
    one encode of a window's rows, their numbers at once (``floattext.json_rows``)."""
    return json_rows([result.to_json() for result in results], sep)


def json_report(
    results: Sequence[PairResult],
    summary: Summary,
    first_failure: Finding | None,
    root_cause: Finding | None,
    first_bad_token: int | None,
    divergence: Divergence | None = None,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """The ``--json`` object (module docstring); ``notes`` only where there are any."""
    obj: dict[str, Any] = {
        "summary": summary.to_json(),
        "first_failure": _finding(first_failure),
        "root_cause": _finding(root_cause),
        "first_bad_token": first_bad_token,
        "divergence": divergence.to_json() if divergence is not None else None,
    }
    if notes:
        obj["notes"] = list(notes)
    obj["rows"] = [json_row(r) for r in results]
    return obj


def dumps_json(report: dict[str, Any] | list[dict[str, Any]]) -> str:
    return ENCODER.encode(report)


def json_head(report: dict[str, Any]) -> str:
    """The ``--json`` object up to its rows: ``{"summary":…,"rows":[`` — the rows (each
    :func:`dumps_json`, comma-separated) and ``]}`` follow, byte for byte what
    :func:`dumps_json` writes for the whole object (``rows`` is its last key)."""
    head = dumps_json({k: v for k, v in report.items() if k != "rows"})
    return head[:-1] + (',"rows":[' if len(head) > 2 else '"rows":[')


METRIC_COLUMNS = (
    *MSIT_METRICS,
    NORM_REL,
    ONE_THOUSANDTH,
    FIVE_THOUSANDTHS,
    NAN_MISMATCH,
    NAN_GOLDEN,
    NAN_TARGET,
    INF_GOLDEN,
    INF_TARGET,
    TOP1,
    TOPK,
    MARGIN,
    EXACT,
    LOCAL,
    INPUT_ERR,
    *STAT_METRICS,
)
"""The Parquet report's metric columns (float64, null where a metric does not apply)."""


def parquet_table(results: Sequence[PairResult]) -> Any:
    """``results`` as a pyarrow Table: the JSON row's fields, one column per metric."""
    import pyarrow as pa

    columns: dict[str, list[Any]] = {
        "token": [r.key.token for r in results],
        "node": [r.key.node for r in results],
        "tensor": [r.key.stem for r in results],
        "rank": [r.key.rank for r in results],
        "verdict": [r.verdict.value for r in results],
        "failed_metrics": [";".join(r.failed) for r in results],
        "reason": [r.reason for r in results],
    }
    for name in METRIC_COLUMNS:
        columns[name] = [r.metrics.get(name) for r in results]
    return pa.table(columns, schema=parquet_schema())


def parquet_schema() -> Any:
    import pyarrow as pa

    fields = [
        ("token", pa.int64()),
        ("node", pa.string()),
        ("tensor", pa.string()),
        ("rank", pa.int64()),
        ("verdict", pa.string()),
        ("failed_metrics", pa.string()),
        ("reason", pa.string()),
    ]
    return pa.schema(fields + [(name, pa.float64()) for name in METRIC_COLUMNS])
