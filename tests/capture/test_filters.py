"""The DumpConfig filters: tokens, parts, names, types, logits only, weights, statistics only."""

from __future__ import annotations

import pytest
import torch
from layerwatch.capture import DumpConfig, register_hook
from safetensors import safe_open
from support import lwdump
from torch import nn

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(99)
    cfg = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=50,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    return transformers.LlamaForCausalLM(cfg).eval()


def _run(model, tmp_path, **kwargs):
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    with register_hook(model, DumpConfig(dump_path=tmp_path, **kwargs)) as handle, torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=4,
            min_new_tokens=4,
            do_sample=False,
            pad_token_id=0,
        )
    return handle.run_dir, out


def test_token_range_keeps_only_those_tokens_but_records_every_tokens_ids(llama, tmp_path):
    run, _ = _run(llama, tmp_path, token_range=[1, 3])
    got = lwdump.tensors(run)
    assert {t for (t, _, _) in got} == {1, 3}
    assert [ln["token"] for ln in lwdump.index(run) if ln["k"] == "token"] == [0, 1, 2, 3]


@pytest.mark.parametrize(("part", "prefix"), [(0, "input"), (1, "output")])
def test_tensor_part(llama, tmp_path, part, prefix):
    run, _ = _run(llama, tmp_path, tensor_part=part, token_range="0")
    stems = {stem for (_, _, stem) in lwdump.tensors(run)}
    assert stems and all(stem.startswith(prefix) for stem in stems)


def test_layer_name_glob_and_module_list(llama, tmp_path):
    run, _ = _run(llama, tmp_path / "g", layer_name="root.model.layers.1.*_proj", token_range="0-1")
    nodes = {node for (_, node, _) in lwdump.tensors(run)}
    assert nodes == {
        f"root.model.layers.1.{n}"
        for n in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        )
    }
    run, _ = _run(
        llama, tmp_path / "t", module_list=[nn.Embedding, type(llama.model.norm)], token_range="0"
    )
    types = {line["type"] for line in lwdump.tensors(run).values()}
    assert types == {"Embedding", "LlamaRMSNorm"}


def test_dump_last_logits_writes_only_the_lm_head_output(llama, tmp_path):
    run, _ = _run(llama, tmp_path, dump_last_logits=True)
    got = lwdump.tensors(run)
    assert set(got) == {(t, "root.lm_head", "output") for t in range(4)}
    ids = [ln["input_ids"] for ln in lwdump.index(run) if ln["k"] == "token"]
    for t in range(3):  # the argmax of token t's logits is token t+1's input
        logits = lwdump.load(run, got[t, "root.lm_head", "output"])
        assert logits[0, -1].argmax().item() == ids[t + 1][0]


def test_dump_weight_writes_each_selected_parameter_once(llama, tmp_path):
    run, _ = _run(
        llama,
        tmp_path,
        dump_weight=True,
        layer_name=["root.model.norm", "root.lm_head"],
        token_range="0",
    )
    weights = {ln["name"]: ln for ln in lwdump.index(run) if ln["k"] == "weight"}
    assert set(weights) == {"root.model.norm.weight", "root.lm_head.weight"}
    line = weights["root.lm_head.weight"]
    assert line["node"] == "root.lm_head" and line["param"] == "weight"
    assert torch.equal(lwdump.load(run, line), llama.lm_head.weight.detach())
    with safe_open(str(run / line["file"]), "pt") as fh:
        assert torch.equal(
            fh.get_tensor("weights/root.lm_head.weight"), llama.lm_head.weight.detach()
        )


def test_statistics_only_writes_no_payload(llama, tmp_path):
    run, _ = _run(llama, tmp_path, dump_statistics_mode=1)
    lines = list(lwdump.tensors(run).values())
    assert lines and all(ln["file"] == "" and ln["stats"]["norm"] >= 0 for ln in lines)
    assert not list((run / "data").iterdir())


def test_tensors_only_mode_has_no_statistics(llama, tmp_path):
    run, _ = _run(llama, tmp_path, dump_statistics_mode=0, token_range="0")
    lines = list(lwdump.tensors(run).values())
    assert lines and all(ln["stats"] is None and ln["file"] for ln in lines)


def test_after_the_last_selected_token_only_the_root_hooks_remain(tmp_path):
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    handle = register_hook(model, DumpConfig(dump_path=tmp_path, token_range="0-1"))
    for _ in range(3):
        model(torch.ones(1, 2))
    hooks = {
        name: len(m._forward_hooks) + len(m._forward_pre_hooks) for name, m in model.named_modules()
    }
    assert hooks == {"": 2, "0": 0, "1": 0}
    model(torch.ones(1, 2))
    handle.close()
    lines = lwdump.index(handle.run_dir)
    assert [ln["token"] for ln in lines if ln["k"] == "token"] == [0, 1, 2, 3]
    assert {t for (t, _, _) in lwdump.tensors(handle.run_dir)} == {0, 1}


def test_device_id_filters_only_accelerators_as_msit_does(tmp_path):
    model = nn.Linear(2, 2)  # on the CPU: device_id does not apply (msit's rule)
    with register_hook(model, DumpConfig(dump_path=tmp_path, device_id=5)) as handle:
        model(torch.ones(1, 2))
    assert (0, "root", "output") in lwdump.tensors(handle.run_dir)
