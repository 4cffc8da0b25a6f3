"""engine/readers/json_stream.py gives what ``json.loads`` gives, entry by entry, whatever the
buffer size, and fails where ``json.loads`` fails (cut, corrupt, extra data) — except that with
``cut_ok`` a file cut short ends the walk after its complete entries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from layerwatch.engine.readers.json_stream import JsonStreamError, ObjectStream

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "msprobe"
FILES = sorted(FIXTURES.glob("*/step0/*/*.json"))


def _walked(path: Path, block: int) -> tuple[dict, dict]:
    head, data = {}, {}
    for where, key, value in ObjectStream(path, block).walk("data"):
        (head if where is None else data)[key] = value
    return head, data


@pytest.mark.parametrize("block", [7, 4096, None])
@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parents[2].name}/{p.name}")
def test_entries_are_json_loads_entries_in_file_order(path: Path, block: int | None) -> None:
    whole = json.loads(path.read_bytes())
    head, data = _walked(path, block or 0)
    if "data" in whole:
        assert list(data.items()) == list(whole.pop("data").items())
    assert list(head.items()) == list(whole.items())


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1, "data": {"x": {"y": [1, 2.5e-3, null, true]}, "z": {}}, "b": 12345678}',
        '\ufeff{"data": {}, "tail": "é\\u00e9"}',
        '{"n": 10000000000000000000000000000001}',
        "  {  }  ",
    ],
)
def test_values_split_anywhere_decode_as_json_loads_does(tmp_path: Path, text: str) -> None:
    path = tmp_path / "d.json"
    path.write_text(text, encoding="utf-8")
    want = json.loads(path.read_bytes())
    for block in range(1, len(text) + 2):
        head, data = _walked(path, block)
        if "data" in want:
            assert data == want["data"], block
        assert head == {k: v for k, v in want.items() if k != "data"}, block


def test_every_cut_and_every_corruption_is_one_error_line(tmp_path: Path) -> None:
    """A file cut at any byte, or with a stray character, fails as json.loads does (never a
    partial success): the message names the file and where."""
    whole = json.loads((FIXTURES / "stats_golden/step0/proc1000/dump.json").read_bytes())
    whole["data"] = dict(list(whole["data"].items())[:5])
    text = json.dumps(whole, indent=1)
    path = tmp_path / "dump.json"
    for cut in range(0, len(text.rstrip()), 37):
        path.write_text(text[:cut])
        with pytest.raises(JsonStreamError) as err:
            _walked(path, 64)
        assert str(path) in str(err.value) and "\n" not in str(err.value)
    for bad in (text.replace('"dtype":', '"dtype";', 1), text + "x", text.replace("[", "{", 1)):
        path.write_text(bad)
        with pytest.raises(ValueError):
            json.loads(bad)
        with pytest.raises(JsonStreamError):
            _walked(path, 64)


@pytest.mark.parametrize("indent", [1, None])
def test_a_clean_cut_ends_the_walk_after_the_complete_entries(
    tmp_path: Path, indent: int | None
) -> None:
    """``cut_ok`` (a file a killed run left part-written): cut at any character, the walk yields
    exactly the entries whose text ends before the cut and says where the file ends; a stray
    character or garbage after the cut is still the error line."""
    whole = json.loads((FIXTURES / "stats_golden/step0/proc1000/dump.json").read_bytes())
    whole["data"] = dict(list(whole["data"].items())[:4])
    text = json.dumps(whole, indent=indent)
    ends, at = [], 0
    for key in whole["data"]:
        at = text.index(json.dumps(key), at)
        depth, i = 0, text.index("{", at)
        while True:  # the entry's closing brace (no braces inside its strings)
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
            if depth == 0:
                break
        ends.append(i)
    path = tmp_path / "dump.json"
    for cut in range(len(text.rstrip())):
        path.write_text(text[:cut])
        for block in (5, 64):
            stream = ObjectStream(path, block, cut_ok=True)
            got = [key for where, key, _ in stream.walk("data") if where]
            assert got == list(whole["data"])[: sum(end <= cut for end in ends)], (cut, block)
            assert stream.cut == cut
    half = text.index(",", len(text) // 2) + 1
    for bad in (text[:half] + "#", text[:half] + "x" + text[-40:], text[:half] + "tx"):
        path.write_text(bad)
        with pytest.raises(JsonStreamError):
            list(ObjectStream(path, 64, cut_ok=True).walk("data"))
    path.write_text(text)
    stream = ObjectStream(path, cut_ok=True)
    assert len([k for w, k, _ in stream.walk("data") if w]) == 4 and stream.cut is None
