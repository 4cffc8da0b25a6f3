"""msprobe dumps (fixtures written by mindstudio-probe 26.2.0) and synthetic dump.json cases."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from layerwatch.engine.readers import open_dump
from layerwatch.engine.readers.load import load_array

from .conftest import FIXTURES

TENSOR_G = FIXTURES / "msprobe" / "tensor_golden"
TENSOR_T = FIXTURES / "msprobe" / "tensor_target"
STATS_G = FIXTURES / "msprobe" / "stats_golden"
STATS_T = FIXTURES / "msprobe" / "stats_target"


def test_tensor_fixture_values_tokens_and_names() -> None:
    update = open_dump(TENSOR_G).poll()
    assert update.notes == []
    assert update.token_ids == {0: (11, 42, 7, 93), 1: (92,)}
    assert {r.key.token for r in update.tensors} == {0, 1}
    for record in update.tensors:
        assert record.loc is not None and record.source.endswith(".pt")
        expected = torch.load(record.source, weights_only=True).numpy()
        np.testing.assert_array_equal(load_array(record.loc), expected)
        if expected.dtype.kind == "f" and expected.size:
            assert record.stats.max == float(expected.max())
    keys = {(r.key.token, r.key.node, r.key.stem) for r in update.tensors}
    assert (1, "root.model.layers.1.mlp.down_proj", "output") in keys
    assert (0, "root.model.layers.0.self_attn", "output_0") in keys
    assert (0, "root.model", "input_input_ids") in keys  # a keyword input
    assert (0, "root.model", "output_last_hidden_state") in keys  # a ModelOutput field
    assert (0, "root.lm_head", "output") in keys
    assert len(update.weights) == 21
    np.testing.assert_array_equal(
        load_array(update.weights["root.lm_head.weight"]),
        torch.load(
            next((TENSOR_G / "step0" / "proc1000" / "dump_tensor_data").glob("Module.lm_head.*.parameters.weight.pt")),
            weights_only=True,
        ).detach().numpy(),
    )  # fmt: skip
    order = {r.key.node: r.order for r in update.tensors if r.key.token == 1}
    assert (
        order["root.model.layers.1.mlp.down_proj"]
        < order["root.model.layers.1.mlp"]
        < order["root.model.layers.1"]
    )
    assert order["root.model"] < order["root.lm_head"]
    topo = update.topology
    assert (
        topo is not None and topo.nodes["root.model.layers.1.mlp"].parent == "root.model.layers.1"
    )


def test_tensor_golden_and_target_pair_and_differ_at_the_fault() -> None:
    golden = {r.key: r for r in open_dump(TENSOR_G).poll().tensors}
    target = {r.key: r for r in open_dump(TENSOR_T).poll().tensors}
    assert set(golden) == set(target)
    for stem, same in (("input_0", True), ("output", False)):
        key = next(
            k for k in golden if k.node == "root.model.layers.1.mlp.down_proj" and k.stem == stem
        )
        equal = np.array_equal(load_array(golden[key].loc), load_array(target[key].loc))
        assert equal is same


def test_statistics_fixture_apis_are_named_per_parent_and_token() -> None:
    golden = open_dump(STATS_G).poll()
    target = open_dump(STATS_T).poll()
    assert all(r.loc is None and r.stats is not None for r in golden.tensors)
    assert {r.key.token for r in golden.tensors} == {0, 1}
    keys = {(r.key.token, r.key.node, r.key.stem) for r in golden.tensors}
    assert keys == {(r.key.token, r.key.node, r.key.stem) for r in target.tensors}
    for token in (0, 1):
        assert (token, "root.model.layers.1.mlp.down_proj.Functional.linear.0", "output") in keys
        assert (token, "root.model.layers.1.mlp.act_fn.Functional.silu.0", "output") in keys
    # The decode step's first embedding call is number 0 again (msprobe says embedding.1).
    assert (1, "root.model.embed_tokens.Functional.embedding.0", "output") in keys
    by = {r.key: r for r in golden.tensors}
    tby = {r.key: r for r in target.tensors}
    fault = next(
        k
        for k in by
        if k.node == "root.model.layers.1.mlp.down_proj" and k.stem == "output" and k.token == 0
    )
    assert by[fault].stats.norm != tby[fault].stats.norm
    order = {r.key.node: r.order for r in golden.tensors if r.key.token == 0}
    assert (
        order["root.model.layers.0.mlp.down_proj.Functional.linear.0"]
        < order["root.model.layers.0.mlp.down_proj"]
    )


def _leaf(value: float, dtype: str = "torch.float32") -> dict:
    return {"type": "torch.Tensor", "dtype": dtype, "shape": [2], "Max": value, "Min": value,
            "Mean": value, "Norm": value, "requires_grad": False}  # fmt: skip


def _write_dump(
    rank_dir: Path, tokens: int, extra_mul_at: int | None = None, raw: str | None = None
) -> None:
    """A statistics dump of a tiny model: preprocessing, per token an MLP with two muls, post ops."""
    data: dict = {}
    construct: dict = {}

    def add(name: str, parent: str | None, value: float = 1.0) -> None:
        data[name] = {
            "input_args": [_leaf(value)],
            "input_kwargs": {},
            "output": [_leaf(value * 2)],
        }
        construct[name] = parent

    count = {"mul": 0, "add": 0}

    def api(kind: str, parent: str | None, value: float = 1.0) -> None:
        add(f"Tensor.__{kind}__.{count[kind]}.forward", parent, value)
        count[kind] += 1

    api("add", None)  # generate's preprocessing: token 0
    for t in range(tokens):
        mlp = f"Module.model.mlp.MLP.forward.{t}"
        api("mul", mlp, 1.0 + t)
        if extra_mul_at == t:
            api("mul", mlp, 5.0)  # a value-neutral extra op in the target
        api("mul", mlp, 3.0 + t)
        add(mlp, f"Module.model.Model.forward.{t}", 7.0 + t)
        add(f"Module.model.Model.forward.{t}", None, 8.0 + t)
        add(f"Module.lm_head.Linear.forward.{t}", None, 9.0 + t)
        api("add", None, 10.0 + t)  # argmax/stopping checks after the token
    rank_dir.mkdir(parents=True, exist_ok=True)
    text = (
        raw if raw is not None else json.dumps({"task": "statistics", "level": "mix", "data": data})
    )
    (rank_dir / "dump.json").write_text(text)
    (rank_dir / "construct.json").write_text(json.dumps(construct))


def test_tokens_from_root_forwards_and_local_counters(tmp_path: Path) -> None:
    _write_dump(tmp_path / "g" / "step0" / "rank0", 3)
    _write_dump(tmp_path / "t" / "step0" / "rank0", 3, extra_mul_at=1)
    golden = open_dump(tmp_path / "g").poll().tensors
    target = open_dump(tmp_path / "t").poll().tensors
    gk = {(r.key.token, r.key.node, r.key.stem): r for r in golden}
    tk = {(r.key.token, r.key.node, r.key.stem): r for r in target}
    assert {k[0] for k in gk} == {0, 1, 2}  # no phantom token for the trailing ops
    assert gk[(0, "root.Tensor.__add__.0", "output")].stats.max == 2.0  # preprocessing → token 0
    assert gk[(0, "root.Tensor.__add__.1", "output")].stats.max == 20.0  # after token 0 → token 0
    assert gk[(2, "root.Tensor.__add__.0", "output")].stats.max == 24.0
    # The extra mul shifts msprobe's global counters; ours only move inside token 1's mlp.
    assert set(tk) - set(gk) == {
        (1, "root.model.mlp.Tensor.__mul__.2", s) for s in ("input_0", "output")
    }
    for key in gk:
        if key[0] != 1:
            assert tk[key].stats.max == gk[key].stats.max, key
    assert gk[(2, "root.model.mlp.Tensor.__mul__.1", "output")].stats.max == 10.0
    assert tk[(2, "root.model.mlp.Tensor.__mul__.1", "output")].stats.max == 10.0


def test_bare_infinity_and_nan_parse(tmp_path: Path) -> None:
    rank = tmp_path / "step0" / "proc77"
    _write_dump(rank, 1)
    text = (rank / "dump.json").read_text()
    text = text.replace('"Max": 2.0', '"Max": Infinity', 1).replace(
        '"Min": 2.0', '"Min": -Infinity', 1
    )
    text = text.replace('"Mean": 2.0', '"Mean": NaN', 1)
    (rank / "dump.json").write_text(text)
    records = open_dump(tmp_path).poll().tensors
    stats = next(r.stats for r in records if r.key.stem == "output")
    assert stats.max == math.inf and stats.min == -math.inf and math.isnan(stats.mean)


def test_rewritten_dump_json_gives_only_new_entries(tmp_path: Path) -> None:
    rank = tmp_path / "step0" / "rank0"
    _write_dump(rank, 1)
    reader = open_dump(tmp_path / "step0")
    first = reader.poll([rank / "dump.json"]).tensors
    assert {r.key.token for r in first} == {0}
    (rank / "dump.json").write_text(
        '{"task": "statistics", "data": {"Tensor.__add__.0.forw'
    )  # mid-rewrite
    update = reader.poll([rank / "dump.json"])
    assert update.tensors == [] and update.notes == []
    _write_dump(rank, 2)
    second = reader.poll([rank / "dump.json"]).tensors
    assert not {r.key for r in first} & {r.key for r in second}
    # Ops after the last forward wait until the dump shows which module closes a token.
    assert {(r.key.token, r.key.node) for r in second if r.key.token == 0} == {
        (0, "root.Tensor.__add__.1")
    }
    full = open_dump(tmp_path / "step0").poll().tensors
    assert sorted(r.key for r in first + second) == sorted(r.key for r in full)


def test_dump_json_file_and_rank_dir_entry_points(tmp_path: Path) -> None:
    rank = tmp_path / "step0" / "rank3"
    _write_dump(rank, 2)
    n = len(open_dump(tmp_path).poll().tensors)
    assert len(open_dump(rank).poll().tensors) == n
    records = open_dump(rank / "dump.json").poll().tensors
    assert len(records) == n and {r.key.rank for r in records} == {3}
