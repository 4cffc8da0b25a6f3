"""The layerwatch-format reader: finished dumps, dumps still being written, odd index lines."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from layerwatch.capture import format as lwf
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.readers import open_dump
from layerwatch.engine.readers.load import load_array

from .conftest import HandDump


def _arrays(seed: int = 0) -> list[tuple[int, str, str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        (0, "root.a", "input_0", rng.standard_normal((2, 3)).astype(np.float32)),
        (0, "root.a", "output", rng.standard_normal((2, 4)).astype(np.float16)),
        (0, "root.b", "output", np.arange(6, dtype=np.int64).reshape(3, 2)),
    ]


def test_reads_a_finished_dump(hand_dump: HandDump) -> None:
    hand_dump.topology()
    hand_dump.token(0, [5, 6, 7])
    hand_dump.append(hand_dump.batch(_arrays()))
    hand_dump.token(1, [9])
    hand_dump.append(hand_dump.batch([(1, "root.a", "output", np.ones((1, 4), np.float32))]))
    hand_dump.end()
    for path in (hand_dump.dir.parent, hand_dump.dir):  # run dir or rank dir
        reader = open_dump(path)
        assert reader.fmt == "layerwatch"
        update = reader.poll()
        assert update.complete
        assert update.token_ids == {0: (5, 6, 7), 1: (9,)}
        keys = {(r.key.token, r.key.node, r.key.stem) for r in update.tensors}
        assert keys == set(hand_dump.arrays)
        for record in update.tensors:
            expected = hand_dump.arrays[(record.key.token, record.key.node, record.key.stem)]
            assert record.shape == expected.shape and record.dtype == str(expected.dtype)
            np.testing.assert_array_equal(load_array(record.loc), expected)
            assert record.stats is not None and math.isnan(record.stats.mean)
            assert record.key.rank == 0 and record.node_type == "Linear"
        topo = update.topology
        assert topo is not None and topo.nodes["root.a"].parent == "root"
        assert topo.nodes["root.b"].order == 1 and topo.nodes["root"].children == [
            "root.a",
            "root.b",
        ]
        assert topo.nodes["root.a"].params["weight"].head == (0.5, -0.5)
        again = reader.poll()  # nothing new, topology unchanged; complete stays true
        assert again.tensors == [] and again.topology is None and again.complete


def test_growing_index_is_read_line_by_line_and_never_twice(hand_dump: HandDump) -> None:
    lines = hand_dump.batch(_arrays())
    first, rest = lines.split("\n", 1)
    index = hand_dump.dir / lwf.INDEX
    reader = open_dump(hand_dump.dir.parent)
    assert reader.poll().tensors == []
    hand_dump.append(first[:25])  # a partial line: nothing yet
    assert reader.poll([index]).tensors == []
    hand_dump.append(first[25:] + "\n")
    got = reader.poll([index]).tensors
    assert [r.key.stem for r in got] == ["input_0"]
    assert reader.poll([index]).tensors == []
    hand_dump.append(rest)
    got = reader.poll([index])
    assert [(r.key.node, r.key.stem) for r in got.tensors] == [
        ("root.a", "output"),
        ("root.b", "output"),
    ]
    assert not got.complete
    hand_dump.append(lines)  # a writer retry: the same tensors again
    assert reader.poll([index]).tensors == []
    hand_dump.end()
    assert reader.poll([index]).complete
    assert reader.poll(None).tensors == []


def test_errors_and_bad_lines_become_notes(hand_dump: HandDump) -> None:
    hand_dump.append(hand_dump.batch(_arrays()[:1]))
    hand_dump.append("{not json\n")
    hand_dump.append('{"k": "t", "token": 0}\n')  # a tensor line missing fields
    hand_dump.append(lwf.encode_line({"k": lwf.K_ERROR, "message": "disk full"}))
    hand_dump.end("stopped: disk full")
    update = open_dump(hand_dump.dir).poll()
    assert len(update.tensors) == 1
    assert any("corrupt index line" in n for n in update.notes)
    assert any("bad tensor line" in n for n in update.notes)
    assert any("capture error: disk full" in n for n in update.notes)
    assert any("capture stopped: stopped: disk full" in n for n in update.notes)
    assert update.complete and all("\n" not in n for n in update.notes)


def test_statistics_only_records_and_weights(hand_dump: HandDump) -> None:
    hand_dump.append(lwf.encode_line({
        "k": "t", "token": 0, "node": "root.a", "stem": "output", "dtype": "bfloat16",
        "shape": [2, 2], "file": "", "begin": 0, "end": 0, "order": 0, "type": "Linear",
        "stats": {"max": "inf", "min": -1.0, "mean": 0.5, "norm": 2.0, "nan": 3, "inf": 1},
    }))  # fmt: skip
    w = np.arange(4, dtype=np.float32).reshape(2, 2)
    line = hand_dump.batch([(0, "root.a", "weight", w)])
    entry = lwf.IndexTensor.from_json(__import__("json").loads(line))
    hand_dump.append(lwf.encode_line({
        "k": lwf.K_WEIGHT, "name": "root.a.weight", "node": "root.a", "param": "weight",
        "dtype": "float32", "shape": [2, 2], "file": entry.file, "begin": entry.begin, "end": entry.end,
    }))  # fmt: skip
    update = open_dump(hand_dump.dir).poll()
    (record,) = update.tensors
    assert record.loc is None and record.dtype == "bfloat16"
    assert record.stats is not None and record.stats.max == math.inf and record.stats.nan == 3
    np.testing.assert_array_equal(load_array(update.weights["root.a.weight"]), w)


def test_ranks_are_numbered_in_device_order_and_complete_needs_all(tmp_path: Path) -> None:
    run = tmp_path / "run"
    b = HandDump(run, "npu1_500")
    a = HandDump(run, "npu0_900")
    a.append(a.batch(_arrays()[:1]))
    b.append(b.batch(_arrays()[:1]))
    a.end()
    reader = open_dump(run)
    update = reader.poll()
    ranks = {r.source.split("/")[-3]: r.key.rank for r in update.tensors}
    assert ranks == {"npu0_900": 0, "npu1_500": 1}
    assert not update.complete
    b.end()
    assert reader.poll([b.dir / lwf.INDEX]).complete
    c = HandDump(run, "npu2_100")  # a rank that appears later
    c.append(c.batch(_arrays()[:1]))
    update = reader.poll([c.dir])
    assert [r.key.rank for r in update.tensors] == [2]


def test_directory_removed_while_reading_is_a_note(hand_dump: HandDump) -> None:
    hand_dump.append(hand_dump.batch(_arrays()))
    reader = open_dump(hand_dump.dir.parent)
    assert len(reader.poll().tensors) == 3
    shutil.rmtree(hand_dump.dir.parent)
    update = reader.poll([hand_dump.dir / lwf.INDEX])
    assert update.tensors == [] and any("disappeared" in n for n in update.notes)
    assert reader.poll().notes == []  # said once


def test_open_dump_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(LayerwatchError, match="no such directory"):
        open_dump(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(LayerwatchError, match="not a dump layerwatch can read") as err:
        open_dump(tmp_path / "empty")
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_reads_a_real_capture_of_a_tiny_llama(tmp_path: Path) -> None:
    """A dump written by layerwatch.capture.register_hook, read back: values equal the model's."""
    import torch
    from layerwatch.capture import DumpConfig, register_hook
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                    attn_implementation="eager")
    ).eval()  # fmt: skip
    seen: dict[str, torch.Tensor] = {}
    model.model.layers[1].mlp.down_proj.register_forward_hook(
        lambda m, i, o: seen.setdefault("down", o.detach().clone())
    )
    prompt = torch.tensor([[11, 42, 7, 93]])
    config = DumpConfig(dump_path=str(tmp_path), dump_weight=True)
    with register_hook(model, config), torch.no_grad():
        out = model.generate(prompt, max_new_tokens=3, do_sample=False, pad_token_id=0)
    update = open_dump(tmp_path).poll()
    assert update.complete
    assert update.token_ids[0] == (11, 42, 7, 93)
    assert update.token_ids[1] == (int(out[0, 4]),)
    tokens = {r.key.token for r in update.tensors}
    assert tokens == {0, 1, 2}
    by_key = {(r.key.token, r.key.node, r.key.stem): r for r in update.tensors}
    down = by_key[(0, "root.model.layers.1.mlp.down_proj", "output")]
    np.testing.assert_array_equal(load_array(down.loc), seen["down"].numpy())
    # Execution order: an inner module finishes before the layer that contains it.
    assert down.order < by_key[(0, "root.model.layers.1", "output")].order
    assert update.topology is not None and "root.model.layers.1.mlp" in update.topology.nodes
    weight = update.weights["root.model.layers.1.mlp.down_proj.weight"]
    np.testing.assert_array_equal(
        load_array(weight), model.model.layers[1].mlp.down_proj.weight.detach().numpy()
    )


def test_a_root_that_takes_no_ids_has_tokens_without_ids_and_no_note(tmp_path: Path) -> None:
    """A model fed float tensors (a vision or embedding-input model): capture writes each
    token line with ``input_ids: null``; that is a token with no ids, not a bad line, so
    reading it (and comparing two such dumps) says nothing about token lines."""
    import torch
    from layerwatch.capture import DumpConfig, register_hook
    from layerwatch.tui.cli import main

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    for side in ("golden", "target"):
        with register_hook(model, DumpConfig(dump_path=str(tmp_path / side))), torch.no_grad():
            for _ in range(3):
                model(torch.ones(1, 4))
    index = next((tmp_path / "golden").glob("*/index.jsonl")).read_text()
    assert index.count('"input_ids":null') == 3  # what capture writes for such a root
    update = open_dump(tmp_path / "golden").poll()
    assert update.token_ids == {0: (), 1: (), 2: ()}
    assert not update.notes and len(update.tensors) == 18
    code = main(["compare", str(tmp_path / "golden"), str(tmp_path / "target")])
    assert code == 0
