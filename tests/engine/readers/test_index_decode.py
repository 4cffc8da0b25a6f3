"""An index decoded by orjson (``readers/layerwatch.py`` ``_fast_json``) gives what ``json``
gave: the same records, token ids, weights, case marks and notes, on lines orjson refuses or
reads otherwise (NaN/Infinity statistics, integers beyond 64 bits, lone surrogates, numbers out
of float range, a byte-order mark, corrupt lines) as well as on plain ones."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from layerwatch.capture import format as lwf
from layerwatch.engine.readers import layerwatch as lw
from layerwatch.engine.readers.base import ReaderUpdate


def _tensor(token: int, i: int, **kw: Any) -> dict[str, Any]:
    line = {
        "k": "t",
        "token": token,
        "node": f"root.layers.{i}",
        "stem": "output",
        "dtype": "float32",
        "shape": [4],
        "file": "data/00000000.safetensors",
        "begin": 16 * i,
        "end": 16 * i + 16,
        "order": i,
        "type": "Linear",
        "stats": None,
    }
    return line | kw


_STATS = {"max": 1.5, "min": -2.0, "mean": 0.25, "norm": 3.0, "nan": 0, "inf": 0}
_ODD = [  # each goes into a block of plain lines of its own
    _tensor(1, 1, stats=_STATS | {"max": float("nan"), "min": float("-inf"), "nan": 2}),
    _tensor(1, 2, stats=_STATS | {"mean": float("inf")}),
    _tensor(1, 3, order=-9_999_999_999_999_999_999),  # below int64: orjson gives a float
    _tensor(2**70, 4),  # beyond uint64: a float too
    _tensor(1, 5, shape=[2**64 + 1]),
    _tensor(1, 6, node="root.\ud800"),  # a lone surrogate: orjson refuses it
    _tensor(1, 7, stats=_STATS | {"max": 0.00012345678901234567}),  # a long fraction
    {"k": "token", "token": 3, "input_ids": [1, 2**66, -(2**65)]},
    {"k": "follow", "token": 3, "own_id": 2**65 + 1, "fed_id": 2**65},
    {"k": "case", "key": "c", "token": 2**64},
    {"k": "weight", "name": "w", "node": "root", "param": "w", "dtype": "float32",
     "shape": [4], "file": "data/w", "begin": 0, "end": 18_446_744_073_709_551_632},
]  # fmt: skip
_RAW = [  # text json reads and orjson refuses or reads otherwise
    b'{"k":"t","token":1,"node":"a","stem":"output","dtype":"float32","shape":[4],'
    b'"stats":{"max":1e400,"min":-1e999,"mean":0.5,"norm":1,"nan":0,"inf":0}}',
    b'\xef\xbb\xbf{"k":"token","token":4,"input_ids":[7]}',
    b'{"k":"t","token":1,"node":"\xed\xa0\x80","stem":"output","dtype":"float32","shape":[4]}',
    b'{"k":"t","token":1, "node" :"b","stem":"output","dtype":"float32","shape":[ 4 ]}',
    b'{"k":"t","token":1,"node":"c","stem":"output","dtype":"float32","shape":[4],"x":[1,}',
    b'{"k":"token","token":5,"input_ids":[-1234567890123456789]}',
]


def _index(tmp_path: Path) -> Path:
    rank = tmp_path / "cpu_1"
    rank.mkdir()
    lines: list[bytes] = []
    for n, odd in enumerate([*map(json.dumps, _ODD), *_RAW]):
        line = odd if isinstance(odd, bytes) else odd.encode("utf-8", "surrogatepass")
        plain = [json.dumps(_tensor(n, i)).encode() for i in range(lw.DECODE_LINES - 1)]
        lines += [*plain[:100], line, *plain[100:]]
    lines.append(json.dumps({"k": "end", "status": "complete"}).encode())
    (rank / lwf.INDEX).write_bytes(b"\n".join(lines) + b"\n")
    return rank


def _read(rank: Path) -> ReaderUpdate:
    return lw.LayerwatchReader(rank).poll(final=True)


def _seen(update: ReaderUpdate) -> str:
    """Everything the reader handed out, as text (a NaN statistic equals itself there)."""
    return repr(
        (
            update.tensors,
            update.notes,
            update.token_ids,
            update.case_marks,
            update.weights,
            update.complete,
        )
    )


def test_an_index_decodes_the_same_with_and_without_orjson(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rank = _index(tmp_path)
    monkeypatch.setattr(lw, "_fast_json", lambda lines: None)
    by_json = _read(rank)
    assert len(by_json.tensors) > len(_ODD + _RAW) * (lw.DECODE_LINES - 2)
    assert any("corrupt index line" in note for note in by_json.notes)
    assert by_json.token_ids[3] == (1, 2**66, -(2**65)) and by_json.case_marks

    decoded: list[bool] = []
    monkeypatch.undo()
    monkeypatch.setattr(lw, "ORJSON_LINES", 0)
    fast = lw._fast_json(1)
    assert fast is not None, "orjson is a dependency (pyproject.toml)"

    def counting(lines: int) -> Callable[[bytes], Any]:
        def loads(text: bytes) -> Any:
            decoded.append(True)
            return fast(text)

        return loads

    monkeypatch.setattr(lw, "_fast_json", counting)
    by_orjson = _read(rank)
    assert _seen(by_orjson) == _seen(by_json)
    # a block a line of _ODD/_RAW, and one for the end line: those holding an integer of 19
    # digits or more (7 of _ODD, 1 of _RAW) went to json at once, the others to orjson first
    assert len(decoded) == len(_ODD) + len(_RAW) + 1 - 8
