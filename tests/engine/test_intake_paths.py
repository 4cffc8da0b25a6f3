"""The record intake's shortcuts give what the step-by-step code gave: a locator built slot by
slot (``records.plain_locator``) against the dataclass's constructor, a tensor line read by
``LayerwatchReader`` against ``IndexTensor.from_json`` and the constructors, a stem's sort
keys remembered (``findings._stem_keys``) against the split they remember. Sibling of
``test_pair_rate_paths.py`` (the compare and report side)."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
from pathlib import Path

import pytest
from layerwatch.capture import format as lwf
from layerwatch.engine.readers.base import stats_from
from layerwatch.engine.readers.layerwatch import LayerwatchReader
from layerwatch.engine.readers.load import canonical_dtype
from layerwatch.engine.records import (
    Locator,
    PairResult,
    TensorKey,
    TensorRecord,
    Verdict,
    plain_locator,
)
from layerwatch.engine.session import findings


# --- locators -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [
        ("/d/data/0.safetensors", 64, 64, "float32", (16,)),
        ("", 0, 0, "bfloat16", ()),
        ("/d/x.pth", 1 << 40, 3, "int8", (1, 2, 3)),
    ],
)
def test_a_plain_locator_is_the_constructors(args: tuple) -> None:
    got, want = plain_locator(*args), Locator(*args)
    assert type(got) is Locator
    assert got == want and hash(got) == hash(want) and repr(got) == repr(want)
    for f in dataclasses.fields(Locator):  # every slot set, the defaults the class declares
        assert getattr(got, f.name) == getattr(want, f.name)
        assert type(getattr(got, f.name)) is type(getattr(want, f.name))
    assert pickle.loads(pickle.dumps(got)) == want
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.offset = 1  # type: ignore[misc]
    assert dataclasses.replace(got, layout="nz") == dataclasses.replace(want, layout="nz")


# --- tensor lines ---------------------------------------------------------------------------
_LINES: list[dict[str, object]] = [
    {"node": "root.a", "stem": "input_0", "dtype": "float32", "shape": [16], "stats": None},
    {"node": "root.a", "stem": "output", "dtype": "torch.bfloat16", "shape": [2, 8], "stats": {}},
    {
        "node": "root.b",
        "stem": "output_1",
        "dtype": "float16",
        "shape": [4],
        "type": "Linear",
        "stats": {"max": 1.0, "min": -2.0, "mean": 0.5, "norm": 3.0, "nan": 0, "inf": 1},
    },
    {"node": "root.b", "stem": "output_2", "dtype": "float32", "shape": [4], "file": ""},
    {"node": "root.c", "stem": "input_x", "dtype": "int64", "shape": [], "order": 7},
    {
        "node": 5,
        "stem": "output",
        "dtype": "float32",
        "shape": [3],
        "stats": {"Max": 2, "Min": 1, "Mean": 1.5, "L2Norm": 3},
    },
]


def _reference(obj: dict, rank_dir: Path) -> TensorRecord:
    """The record the reader made before its shortcuts: ``IndexTensor.from_json``'s fields,
    the constructors, ``stats_from`` on every line."""
    t = lwf.IndexTensor.from_json(obj)
    dtype = canonical_dtype(t.dtype)
    source = os.path.join(rank_dir, t.file) if t.file else ""
    loc = Locator(source, t.begin, t.end - t.begin, dtype, t.shape) if t.file else None
    return TensorRecord(
        key=TensorKey(t.token, t.node, t.stem, 0),
        dtype=dtype,
        shape=t.shape,
        loc=loc,
        stats=stats_from(obj.get("stats")),  # type: ignore[arg-type]
        order=t.order,
        node_type=t.node_type,
        source=source,
    )


def test_tensor_lines_make_the_records_the_step_by_step_code_made(tmp_path: Path) -> None:
    rank_dir = tmp_path / "cpu_1"
    rank_dir.mkdir()
    objs = []
    for token in range(3):  # names, dtypes and shapes met again come from the shared tables
        for i, line in enumerate(_LINES):
            obj = {"k": "t", "token": token, "file": "data/0.safetensors", "begin": 64 * i}
            obj |= line
            obj["end"] = 64 * i + 32
            objs.append(obj)
    (rank_dir / lwf.INDEX).write_text("".join(json.dumps(o) + "\n" for o in objs))
    update = LayerwatchReader(rank_dir).poll(final=True)
    assert not update.notes
    assert update.tensors == [_reference(o, rank_dir) for o in objs]
    for record in update.tensors:
        assert type(record.key) is TensorKey and record.key.stem == record.key[2]
        assert type(record.key.node) is str and type(record.shape) is tuple
        assert record.loc is None or type(record.loc) is Locator


# --- stem order -----------------------------------------------------------------------------
_STEMS = ["output", "output_2", "output_10", "input_0", "input_hidden_states", "output_1_0", "x9y"]


def test_remembered_stem_keys_are_the_split_they_remember(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(findings, "_STEM_KEYS", {})
    monkeypatch.setattr(findings, "_STEM_KEYS_MAX", 4)  # the table clears itself when full
    for _ in range(3):
        for stem in _STEMS:
            want = tuple(int(p) if p.isdigit() else p for p in findings._DIGITS.split(stem))
            assert findings.stem_sort(stem) == want
            assert len(findings._STEM_KEYS) <= 4
    key = TensorKey(2, "root.n", "output_10", 1)
    result = PairResult(key, Verdict.PASS, order=-1)
    assert findings.report_key(result) == (2, 1, 1 << 40, "root.n", 1, ("output_", 10, ""))
    result.order = 3
    assert findings.failure_key(result) == (2, False, 3, 1, "root.n", ("output_", 10, ""))
    assert sorted(_STEMS, key=findings.stem_sort) == [
        "input_0",
        "input_hidden_states",
        "output",
        "output_1_0",
        "output_2",
        "output_10",
        "x9y",
    ]
