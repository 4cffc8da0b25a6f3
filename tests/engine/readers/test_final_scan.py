"""``poll(None, final=True)``: the writer finished, so a file still incomplete is reported.

A live scan cannot tell a truncated file from one still being written, so it waits (silently)
for the file to become whole. Once the caller says the writer finished, each reader names every
such file once (``"{path}: truncated or corrupt, skipped"``) instead of leaving the user with
only an unpaired counterpart. Real fixture dumps (msit, ATB, msprobe) and a hand-written
layerwatch dump, cut short with ``os.truncate``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
from layerwatch.engine.readers import open_dump
from layerwatch.engine.readers.base import skipped_note

from .conftest import FIXTURES, HandDump


def _cut(path: Path, keep: int | None = None) -> None:
    os.truncate(path, keep if keep is not None else path.stat().st_size // 2)


def _final_behaviour(root: Path, cut: Path) -> None:
    """A live full scan waits silently; the final one names the file once; a fresh reader's
    first (and only) final scan names it too; the file never becomes a tensor."""
    reader = open_dump(root)
    live = reader.poll()
    assert skipped_note(cut) not in live.notes
    final = reader.poll(None, final=True)
    assert final.notes.count(skipped_note(cut)) == 1, final.notes
    assert skipped_note(cut) not in reader.poll(None, final=True).notes  # said once
    fresh = open_dump(root).poll(None, final=True)
    assert fresh.notes.count(skipped_note(cut)) == 1, fresh.notes
    for update in (live, final, fresh):
        assert str(cut) not in {r.source for r in update.tensors}


def test_msit_truncated_pth(tmp_path: Path) -> None:
    root = tmp_path / "msit_dump_1"
    shutil.copytree(FIXTURES / "msit" / "golden" / "msit_dump_fixture", root)
    cut = root / "torch_tensors/cpu_1000/1/root.model.layers.0.mlp.down_proj/output.pth"
    _cut(cut)
    _final_behaviour(root, cut)
    whole = open_dump(FIXTURES / "msit" / "golden" / "msit_dump_fixture").poll()
    got = open_dump(root).poll(None, final=True)
    assert len(got.tensors) == len(whole.tensors) - 1  # nothing else is lost


def test_atb_truncated_bin_and_the_after_copy_takes_over(tmp_path: Path) -> None:
    root = tmp_path / "msit_dump_1"
    shutil.copytree(FIXTURES / "atb" / "msit_dump_fixture", root)
    op = root / "tensors/0_4242/0/1_Decoder/1_LinearOperation"
    cut = op / "before" / "intensor1.bin"
    # An input dumped before and after the op: before/ is preferred, and waited for while it is
    # incomplete; once the writer finished, the whole after/ copy is used instead.
    shutil.copy2(cut, op / "after" / "intensor1.bin")
    _cut(cut, 100)
    reader = open_dump(root)
    live = reader.poll()
    key = (0, "root.1_Decoder.1_LinearOperation", "input_1")
    assert not [r for r in live.tensors if (r.key.token, r.key.node, r.key.stem) == key]
    final = reader.poll(None, final=True)
    assert final.notes.count(skipped_note(cut)) == 1, final.notes
    (record,) = [r for r in final.tensors if (r.key.token, r.key.node, r.key.stem) == key]
    assert record.source == str(op / "after" / "intensor1.bin")


def test_atb_truncated_bin_without_a_copy(tmp_path: Path) -> None:
    root = tmp_path / "msit_dump_1"
    shutil.copytree(FIXTURES / "atb" / "msit_dump_fixture", root)
    cut = root / "tensors/0_4242/0/1_Decoder/1_LinearOperation/after/outtensor0.bin"
    _cut(cut, cut.stat().st_size - 8)  # the header is whole, the payload is short
    _final_behaviour(root, cut)


def test_msprobe_truncated_pt(tmp_path: Path) -> None:
    root = tmp_path / "dump"
    shutil.copytree(FIXTURES / "msprobe" / "tensor_golden", root)
    data = root / "step0/proc1000/dump_tensor_data"
    cut = data / "Module.model.layers.1.mlp.down_proj.Linear.forward.0.input.0.pt"
    _cut(cut)
    _final_behaviour(root, cut)


def test_msprobe_corrupt_dump_json(tmp_path: Path) -> None:
    root = tmp_path / "dump"
    shutil.copytree(FIXTURES / "msprobe" / "tensor_golden", root)
    dump = root / "step0/proc1000/dump.json"
    text = dump.read_text()
    colon = text.index('": ', len(text) // 2) + 1
    dump.write_text(text[:colon] + "#" + text[colon + 1 :])  # garbled, not cut
    reader = open_dump(root)
    assert skipped_note(dump) not in reader.poll().notes  # being rewritten, maybe
    assert reader.poll(None, final=True).notes.count(skipped_note(dump)) == 1
    assert skipped_note(dump) not in reader.poll(None, final=True).notes


def test_msprobe_dump_json_cut_short(tmp_path: Path) -> None:
    """Cut short (not corrupt): waited for while live, then its complete calls with one note
    (tests/engine/session/test_msprobe_cut.py compares them)."""
    root = tmp_path / "dump"
    shutil.copytree(FIXTURES / "msprobe" / "tensor_golden", root)
    dump = root / "step0/proc1000/dump.json"
    _cut(dump)
    reader = open_dump(root)
    live = reader.poll()
    assert not live.notes and not live.tensors  # being rewritten, maybe
    final = reader.poll(None, final=True)
    assert final.tensors and [n for n in final.notes if n.startswith(f"{dump}: cut short")]
    assert not reader.poll(None, final=True).notes


def test_layerwatch_torn_last_index_line(tmp_path: Path) -> None:
    dump = HandDump(tmp_path)
    lines = dump.batch([(0, "root.a", "output", np.ones(4, np.float32))])
    index = dump.dir / "index.jsonl"
    with open(index, "a") as fh:
        fh.write(lines)
        fh.write(json.dumps({"k": "t", "token": 0, "node": "root.b"})[:20])  # killed mid-line
    reader = open_dump(tmp_path)
    live = reader.poll()
    assert len(live.tensors) == 1 and not live.notes
    final = reader.poll(None, final=True)
    assert final.notes == [f"{index}: last line cut short, skipped"]
    assert not reader.poll(None, final=True).notes
