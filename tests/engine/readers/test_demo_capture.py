"""Real dumps of the demo model written by layerwatch.capture, read back — also while growing."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from layerwatch.engine.readers import open_dump
from layerwatch.engine.readers.load import load_array

pytestmark = pytest.mark.slow


def test_demo_capture_read_back(tmp_path: Path) -> None:
    import torch
    from layerwatch.capture import DumpConfig, register_hook
    from layerwatch.capture.demo import build_model, generate, make_prompt

    model = build_model()
    outputs: dict[int, torch.Tensor] = {}
    layer = model.layers[1]
    layer.register_forward_hook(
        lambda m, i, o: outputs.setdefault(len(outputs), o.detach().clone())
    )
    prompt = make_prompt()
    with register_hook(model, DumpConfig(dump_path=str(tmp_path))):
        ids = generate(model, prompt, new_tokens=3)
    update = open_dump(tmp_path).poll()
    assert update.complete and update.notes == []
    assert update.token_ids == {
        0: tuple(prompt[0].tolist()),
        1: (int(ids[0, prompt.shape[1]]),),
        2: (int(ids[0, prompt.shape[1] + 1]),),
    }
    by_key = {(r.key.token, r.key.node, r.key.stem): r for r in update.tensors}
    for token, expected in outputs.items():
        record = next(
            r
            for k, r in by_key.items()
            if k[:2] == (token, "root.layers.1") and k[2].startswith("output")
        )
        np.testing.assert_array_equal(load_array(record.loc), expected.numpy())
    order = {r.key.node: r.order for r in update.tensors if r.key.token == 1}
    assert (
        order["root.layers.1.attention.wq"]
        < order["root.layers.1.attention"]
        < order["root.layers.1"]
    )
    assert (
        update.topology is not None
        and update.topology.nodes["root.layers.1"].parent == "root.layers"
    )


def test_reading_a_demo_dump_while_it_is_written(tmp_path: Path) -> None:
    """Poll the index while a child process captures: every tensor once, none partial (40
    tokens: long enough that a loaded box still polls more than once before the run ends)."""
    dump = tmp_path / "dump"
    child = subprocess.Popen(
        [sys.executable, "-m", "layerwatch.capture.demo", "--new-tokens", "40", "--dump", str(dump)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    reader = None
    seen = []
    polls = 0
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            if reader is None:
                try:
                    reader = open_dump(dump)
                except Exception:  # not created yet
                    time.sleep(0.01)
                    continue
            index = [p / "index.jsonl" for p in dump.iterdir() if p.is_dir()]
            update = reader.poll(index)
            polls += 1
            for record in update.tensors:
                load_array(record.loc)  # the bytes are on disk when the index says so
            seen += update.tensors
            if update.complete:
                break
            time.sleep(0.005)
        assert child.wait(timeout=60) == 0, child.stderr.read() if child.stderr else ""
    finally:
        child.kill()
    assert reader is not None and polls > 1
    keys = [r.key for r in seen]
    assert len(keys) == len(set(keys))
    full = open_dump(dump).poll()
    assert sorted(keys) == sorted(r.key for r in full.tensors)
    assert {k.token for k in keys} == set(range(40))
