"""``layerwatch dump``'s closing count (``capture/dumpcmd.py::count_dump``) counts tensor lines
without decoding them; it must agree with decoding every line, torn last line and errors included."""

from __future__ import annotations

import json

import torch
from layerwatch.capture import DumpConfig, register_hook
from layerwatch.capture.dumpcmd import count_dump
from torch import nn


def _decoded(index) -> tuple[int, int]:
    """(tokens, tensors) by decoding every complete line: what the count must equal."""
    tokens, tensors = set(), 0
    for line in index.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        tensors += rec["k"] == "t"
        if rec["k"] == "token":
            tokens.add(rec["token"])
    return len(tokens), tensors


def test_count_agrees_with_decoding_every_line(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    handle = register_hook(model, DumpConfig(dump_path=tmp_path))
    for _ in range(5):
        model(torch.randn(3, 4))
    handle.close()
    (index,) = tmp_path.glob("*/index.jsonl")
    ranks, tokens, tensors, messages = count_dump(tmp_path)
    assert (ranks, messages) == (1, [])
    assert (tokens, tensors) == _decoded(index) and tensors > 5
    whole = index.read_bytes()
    last = whole.splitlines(keepends=True)[-2]  # a tensor line (the last is the end line)
    assert last.startswith(b'{"k":"t",')
    with index.open("ab") as f:  # a stopped writer: an error line, then half a tensor line
        f.write(b'{"k":"error","message":"capture stopped: disk full"}\n' + last[:-9])
    assert count_dump(tmp_path) == (1, tokens, tensors, ["capture stopped: disk full"])
