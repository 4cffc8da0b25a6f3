"""A finished layerwatch index opened as columns: the same tensors, token ids, weights and
notes as ``poll``, whatever the lines look like (both writers' key orders, escaped and
non-ASCII names, corrupt and cut-short lines, lines longer than a scan block)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from layerwatch.capture import format as lwf
from layerwatch.capture.index_lines import tensor_line
from layerwatch.engine.readers import index_columns, open_dump
from layerwatch.engine.readers.index_columns import NameTable, scan_file

from .conftest import HandDump


def _line(token: int, node: str, stem: str, **more: object) -> str:
    obj = {
        "k": "t",
        "token": token,
        "node": node,
        "stem": stem,
        "dtype": "float32",
        "shape": [2],
        "file": "",
        "begin": 0,
        "end": 0,
        "order": 0,
        "type": "Linear",
        "stats": {"max": 1.0, "min": -1.0, "mean": 0.0, "norm": 1.0, "nan": 0, "inf": 0},
    }
    obj.update(more)  # fmt: skip
    return lwf.encode_line(obj)


def _same_as_poll(run: Path) -> None:
    """Columns then records, against one ``poll`` of the same dump."""
    polled = open_dump(run).poll(None, final=True)
    table = open_dump(run).open_columns()
    tokens = table.tokens()
    built, notes = table.records(int(tokens.min()), int(tokens.max())) if len(tokens) else ([], [])
    assert repr(built) == repr(polled.tensors)  # repr: a NaN statistic equals itself
    assert table.head.token_ids == polled.token_ids
    assert table.head.weights == polled.weights
    assert table.head.topology == polled.topology
    assert table.head.complete == polled.complete
    assert table.head.case_marks == polled.case_marks
    key = [n.split(" (")[0] for n in polled.notes]  # where a line is differs: line vs byte
    assert sorted(n.split(" (")[0] for n in table.head.notes + notes) == sorted(key)
    spans = open_dump(run).open_columns().compact()  # kept as each token's byte range
    in_order = [bool(np.all(np.diff(cols.token) >= 0)) for _, cols in table.ranks]
    assert [sp is not None for sp in spans.spans] == in_order  # out of order: rows stay
    assert all(len(cols) == 0 for (_, cols), o in zip(spans.ranks, in_order, strict=True) if o)
    assert spans.tensors == table.tensors
    tokens, _ = spans.token_counts()
    again, more = spans.records(int(tokens.min()), int(tokens.max())) if len(tokens) else ([], [])
    assert repr(again) == repr(built) and set(notes) <= set(more) <= set(notes + table.head.notes)
    folded = open_dump(run).open_columns(per_token=True)  # folded as scanned (scan_index's way)
    assert folded.tensors == table.tensors
    assert folded.scan == replace(table.scan, rows=sum(len(c.token) for _, c in folded.ranks))
    for (_, cols), sp in zip(folded.ranks, spans.spans, strict=True):
        assert (cols.spans is None) == (sp is None)  # out of order: scanned again as rows
        if sp is not None:
            assert len(cols.token) == 0 and _same_spans(cols.spans, sp)
    assert folded.token_counts()[0].tolist() == tokens.tolist()
    low, high = (int(tokens.min()), int(tokens.max())) if len(tokens) else (0, 0)
    once, more = folded.records(low, high) if len(tokens) else ([], [])
    assert repr(once) == repr(built) and set(notes) <= set(more) <= set(notes + table.head.notes)


def _same_spans(a: object, b: object) -> bool:
    return all(
        np.array_equal(getattr(a, f), getattr(b, f)) for f in ("token", "begin", "end", "count")
    )


def test_columns_hold_what_poll_reads(hand_dump: HandDump) -> None:
    rng = np.random.default_rng(0)
    hand_dump.topology()
    for token in range(3):
        hand_dump.token(token, [token + 5])
        hand_dump.append(hand_dump.batch([
            (token, "root.a", "input_0", rng.standard_normal((2, 3)).astype(np.float32)),
            (token, "root.a", "output", rng.standard_normal(4).astype(np.float16)),
            (token, "root.b", "output", np.arange(6, dtype=np.int64)),
        ]))  # fmt: skip
    hand_dump.append(_line(1, "root.a", "output"))  # a key repeated: built once
    hand_dump.end()
    _same_as_poll(hand_dump.dir.parent)
    table = open_dump(hand_dump.dir).open_columns()
    assert table.tensors == 10 and table.tokens().tolist() == [0] * 3 + [1] * 3 + [2] * 3 + [1]
    one, _ = table.records(1, 1)
    assert [(r.key.node, r.key.stem) for r in one] == [
        ("root.a", "input_0"), ("root.a", "output"), ("root.b", "output")
    ]  # fmt: skip


def test_odd_lines_take_the_json_way_and_bad_ones_stay_notes(hand_dump: HandDump) -> None:
    hand_dump.token(0, [1, 2])
    hand_dump.append(_line(0, 'root."quoted"\\path', "output"))  # escapes: JSON decodes them
    hand_dump.append(_line(0, "root.ünïcode.層", "output_0"))  # UTF-8 bytes, no escapes
    hand_dump.append(_line(0, "root.x", "output", order=-1))
    hand_dump.append('{"token":0,"k":"t","node":"root.y","stem":"output","dtype":"float32",'
                     '"shape":[2],"file":"","begin":0,"end":0,"order":1,"type":"","stats":null}\n')  # fmt: skip
    hand_dump.append("\n{not json\n")
    hand_dump.append('{"k": "t", "token": 0}\n')  # a tensor line missing fields
    hand_dump.append('{"k":"t","token":0,"node":"root.z","stem":"output",BROKEN\n')
    hand_dump.append(lwf.encode_line({"k": lwf.K_ERROR, "message": "disk full"}))
    hand_dump.append(lwf.encode_line({"k": lwf.K_WEIGHT, "name": "w", "node": "root.x",
                                      "param": "weight", "dtype": "float32", "shape": [1],
                                      "file": "", "begin": 0, "end": 4}))  # fmt: skip
    hand_dump.append(lwf.encode_line({"k": lwf.K_CASE, "key": "a", "token": 0}))
    hand_dump.end("stopped: disk full")
    hand_dump.append(_line(0, "root.late", "output")[:30])  # cut short
    _same_as_poll(hand_dump.dir)
    table = open_dump(hand_dump.dir).open_columns()
    names = [table.names.names[i] for i in table.ranks[0][1].node]
    assert names[:4] == ['root."quoted"\\path', "root.ünïcode.層", "root.x", "root.y"]
    assert any("last line cut short" in n for n in table.head.notes)


def test_the_capture_writers_line_and_a_long_line_across_scan_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from layerwatch.capture.handoff import TensorItem

    monkeypatch.setattr(index_columns, "BLOCK_BYTES", 256)  # many blocks, a line longer than one
    text = []
    for token in range(40):
        item = TensorItem.__new__(TensorItem)
        for name, value in dict(
            token=token,
            node=f"root.layers.{token % 7}." + "n" * (token * 9),
            stem="output",
            node_type="Linear",
            order=token % 7,
            alias=None,
            tail=None,
            dtype_name="bfloat16",
            shape=(token + 1, 3),
            file="data/00000001.safetensors",
            begin=10 * token,
            end=10 * token + 6,
            stats=(1.0, -1.0, float("nan"), float("inf"), 2, 1),
        ).items():
            object.__setattr__(item, name, value)
        text.append(tensor_line(item))
    index = tmp_path / "index.jsonl"
    index.write_text("".join(text), encoding="utf-8")
    cols = scan_file(index, table := NameTable())
    objs = [json.loads(line) for line in text]
    assert cols.token.tolist() == [o["token"] for o in objs]
    assert [table.names[i] for i in cols.node] == [o["node"] for o in objs]
    assert [table.names[i] for i in cols.stem] == [o["stem"] for o in objs]
    raw = index.read_bytes()
    assert [raw[o : o + n] for o, n in zip(cols.offset, cols.length, strict=True)] == [
        line.rstrip("\n").encode() for line in text
    ]
    assert cols.extra == [] and not cols.torn and cols.size == len(raw)


def test_only_nodes_builds_the_matching_records(hand_dump: HandDump) -> None:
    rows = [(t, f"root.layers.{i}.mlp", "output", np.ones(2, np.float32)) for t in range(2)
            for i in range(3)]  # fmt: skip
    hand_dump.append(hand_dump.batch(rows))
    table = open_dump(hand_dump.dir).open_columns().only_nodes("root.layers.1.*")
    built, _ = table.records(0, 1)
    assert [(r.key.token, r.key.node) for r in built] == [
        (0, "root.layers.1.mlp"), (1, "root.layers.1.mlp")
    ]  # fmt: skip


def test_a_hash_collision_is_caught_and_the_bytes_decide(
    hand_dump: HandDump, monkeypatch: pytest.MonkeyPatch
) -> None:
    for token in range(3):
        for node in ("root.a", "root.b", "root.ab"):
            hand_dump.append(_line(token, node, "output"))
            hand_dump.append(_line(token, node, "input_0"))
    monkeypatch.setattr(index_columns, "_MIX", (np.uint64(0), index_columns._MIX[1]))
    table = NameTable()
    cols = scan_file(hand_dump.dir / lwf.INDEX, table)  # the first hash is 0 for every row
    got = [(table.names[n], table.names[s]) for n, s in zip(cols.node, cols.stem, strict=True)]
    assert got == [(n, s) for _ in range(3) for n in ("root.a", "root.b", "root.ab")
                   for s in ("output", "input_0")]  # fmt: skip


def _bench_dump(rank_dir: Path, tokens: int, *, late: int | None = None) -> Path:
    """A bench_scale dump (9 ops × 2 stems a layer); ``late``: that token's lines moved after
    the next token's (an index out of token order)."""
    from bench.bench_scale import write_dump

    write_dump(rank_dir, tokens, 72, noise=0.0, seed=1)
    if late is not None:
        index = rank_dir / lwf.INDEX
        lines = index.read_text().splitlines(keepends=True)
        moved = [line for line in lines if line.startswith(f'{{"k":"t","token":{late},')]
        rest = [line for line in lines if line not in moved]
        at = max(i for i, x in enumerate(rest) if x.startswith(f'{{"k":"t","token":{late + 1},'))
        index.write_text("".join(rest[: at + 1] + moved + rest[at + 1 :]))
    return rank_dir


@pytest.mark.parametrize("nodes", [None, "*.mlp.*", "*layers.1.*", "nothing*"])
def test_an_index_folded_per_token_keeps_no_row_and_builds_the_rows_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nodes: str | None
) -> None:
    """What ``compare`` opens (``scan_index``: per token, ``--nodes`` counted at the scan) holds
    no array a tensor line for an index in token order — spans and counts across many scan
    blocks, a token's lines cut by a block edge — and builds, for any token range, the records
    the row columns build; an index out of token order is scanned again as rows."""
    monkeypatch.setattr(index_columns, "BLOCK_BYTES", 4096)  # a token spans ~8 blocks
    for late in (None, 3):
        run = _bench_dump(tmp_path / f"late{late}" / "cpu_1", 12, late=late)
        rows = open_dump(run).open_columns()
        rows = rows.only_nodes(nodes) if nodes else rows
        reader = open_dump(run)
        scan = reader.scan_index(nodes)
        folded = reader.open_columns()  # the table scan_index opened
        assert scan.tensors == 12 * 72 == folded.scan.tensors == rows.scan.tensors
        (_, cols), (_, want) = folded.ranks[0], rows.ranks[0]
        assert scan.rows == len(cols.token)  # what the memory estimate reads (budget.py)
        if late is None or nodes == "nothing*":  # no line kept: none out of order
            assert cols.spans is not None and len(cols.spans.token) <= 12
            assert all(
                len(getattr(cols, f)) == 0 for f in ("token", "node", "stem", "offset", "length")
            )
        else:
            assert cols.spans is None and cols.token.tolist() == want.token.tolist()
        assert folded.tensors == rows.tensors
        for got, expect in zip(folded.token_counts(), rows.token_counts(), strict=True):
            assert got.tolist() == expect.tolist()
        if nodes:
            assert folded.only_nodes(nodes) is folded  # applied at the scan
        for low, high in ((0, 11), (2, 4), (3, 3), (11, 40)):
            assert repr(folded.records(low, high)) == repr(rows.records(low, high))
