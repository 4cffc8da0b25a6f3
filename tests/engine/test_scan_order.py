"""The scanner's bookkeeping on synthetic records: chunked arrival equals one pass, ranks,
dumps without inputs (engine/scan.py)."""

from __future__ import annotations

import math

from layerwatch.engine.records import Stats, TensorKey, TensorRecord
from layerwatch.engine.scan import APPEARS, INSIDE, PROPAGATED, Scanner, scan_records

CLEAN = Stats(1.0, -1.0, 0.0, 3.0)
BAD = Stats(1.0, -1.0, 0.0, 3.0, nan=2)
NODES = ["root.l0.a", "root.l0.b", "root.l0", "root.l1.a", "root.l1", "root"]
"""Completion order at every token: inner before outer."""


INPUT_FROM = {"root.l0.b": "root.l0.a", "root.l1.a": "root.l0", "root.l1": "root.l0"}
"""Whose output each node takes in (the others take clean inputs: ids, the layer's input)."""
OUTPUT_OF = {"root.l0": "root.l0.b", "root.l1": "root.l1.a", "root": "root.l1"}
"""A container's output is its last child's."""


def _run(bad_at: tuple[int, str] | None, tokens: int = 3, rank: int = 0, inputs: bool = True):
    records = []
    for token in range(tokens):
        bad: set[str] = set()
        for order, node in enumerate(NODES):
            in_bad = INPUT_FROM.get(node) in bad
            if (token, node) == bad_at or in_bad or OUTPUT_OF.get(node) in bad:
                bad.add(node)
            keys = [("input_0", in_bad)] if inputs else []
            for stem, is_bad in [*keys, ("output", node in bad)]:
                key = TensorKey(token, node, stem, rank)
                stats = BAD if is_bad else CLEAN
                records.append(TensorRecord(key, "float16", (4,), None, stats, order))
    return records


def test_chunked_arrival_gives_the_same_rows_as_one_pass() -> None:
    records = _run((1, "root.l0.b"))
    whole = scan_records(records)
    scanner = Scanner()
    for i in range(0, len(records), 3):
        scanner.add(records[i : i + 3])
    scanner.finish()
    assert scanner.report.to_json() == whole.to_json()
    first = whole.first_failure
    assert first is not None and (first.key.token, first.key.node) == (1, "root.l0.b")
    status = {(r.key.token, r.key.node): r.status for r in whole.rows}
    assert status[(1, "root.l0.b")] == APPEARS
    assert status[(1, "root.l0")] == INSIDE  # its child is where it appeared
    assert status[(1, "root.l1.a")] == PROPAGATED  # its input carries the NaN


def test_ranks_and_the_first_in_execution_order() -> None:
    records = _run((2, "root.l1.a"), rank=0) + _run((1, "root.l0.a"), rank=1)
    report = scan_records(records)
    obj = report.to_json()
    assert obj["summary"]["ranks"] == 2
    assert obj["first_failure"]["rank"] == 1 and obj["first_failure"]["token"] == 1


def test_without_inputs_the_first_in_order_is_the_answer() -> None:
    report = scan_records(_run((0, "root.l0.b"), inputs=False))
    first = report.first_failure
    assert first is not None and (first.key.token, first.key.node) == (0, "root.l0.b")
    assert report.to_json()["summary"]["peak_ratio"] is None


def test_clean_run_reports_null_first_failure() -> None:
    obj = scan_records(_run(None)).to_json()
    assert obj["first_failure"] is None and obj["rows"] == []
    assert obj["summary"]["tensors"] == 3 * len(NODES)
    assert not math.isnan(obj["summary"]["peak_ratio"]["value"])
