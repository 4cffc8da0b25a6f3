"""A capture keeps full collections off the process's older heap (``capture/heap.py``): the
first capture freezes it, the last one to close thaws it, a program's own freeze is left alone."""

from __future__ import annotations

import gc

import torch
from layerwatch.capture import DumpConfig, register_hook
from torch import nn


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU())


def test_captures_freeze_the_heap_until_the_last_one_closes(tmp_path):
    gc.unfreeze()  # another test of this process may have frozen it
    a, b = _model(), _model()
    first = register_hook(a, DumpConfig(dump_path=tmp_path / "a"))
    frozen = gc.get_freeze_count()
    assert frozen > 1000  # torch and the test's modules at least
    second = register_hook(b, DumpConfig(dump_path=tmp_path / "b"))
    garbage = [[]]
    garbage[0].append(garbage)  # a cycle made during the capture is still collectable
    del garbage
    assert gc.collect() >= 1
    a(torch.ones(2, 4))
    first.close()
    assert gc.get_freeze_count() > frozen // 2  # b still captures (freed objects leave the count)
    b(torch.ones(2, 4))
    second.close()
    assert gc.get_freeze_count() == 0
    for out in ("a", "b"):  # and the capture itself is whole
        (index,) = (tmp_path / out).glob("*/index.jsonl")
        text = index.read_text()  # root, Linear, ReLU: an input and an output each
        assert text.count('{"k":"t",') == 6 and '"status":"complete"' in text


def test_a_program_that_froze_its_heap_keeps_it_frozen(tmp_path):
    gc.unfreeze()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        handle = register_hook(_model(), DumpConfig(dump_path=tmp_path))
        assert gc.get_freeze_count() <= frozen  # not frozen again (that would add the model)
        handle.close()
        assert gc.get_freeze_count() > frozen // 2  # not thawed
    finally:
        gc.unfreeze()
