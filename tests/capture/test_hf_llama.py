"""Capturing a real Hugging Face LlamaForCausalLM (tests/support/tiny_hf.py: tiny, nothing downloaded)."""

from __future__ import annotations

import json

import pytest
import torch
from layerwatch.capture import DumpConfig, register_hook
from safetensors import safe_open
from support import lwdump, tiny_hf

transformers = pytest.importorskip("transformers")

NEW_TOKENS = tiny_hf.NEW_TOKENS
PROMPT = tiny_hf.PROMPT


@pytest.fixture(scope="module")
def llama():
    return tiny_hf.build("llama")


@pytest.fixture(scope="module")
def dumped(llama, tmp_path_factory):
    ids = tiny_hf.prompt()
    out_dir = tmp_path_factory.mktemp("hf")
    with register_hook(llama, DumpConfig(dump_path=out_dir)) as handle:
        generated = tiny_hf.generate(llama, ids)
    return handle.run_dir, ids, generated


def test_tokens_follow_generate_and_input_ids_are_recorded(dumped):
    run, prompt, generated = dumped
    lines = lwdump.index(run)
    ids = {ln["token"]: ln["input_ids"] for ln in lines if ln["k"] == "token"}
    assert sorted(ids) == list(range(NEW_TOKENS))  # prefill + NEW_TOKENS-1 decode steps
    assert ids[0] == prompt[0].tolist()
    for step in range(1, NEW_TOKENS):
        assert ids[step] == [generated[0, PROMPT + step - 1].item()]
    assert lines[-1]["k"] == "end" and lines[-1]["status"] == "complete"


def test_kwargs_model_outputs_and_names(dumped):
    run, _, _ = dumped
    got = lwdump.tensors(run)
    nodes = {node for (_, node, _) in got}
    assert {
        "root",
        "root.model",
        "root.model.layers.1.self_attn.o_proj",
        "root.lm_head",
        "root.model.layers.0.mlp.act_fn",
        "root.model.rotary_emb",
    } <= nodes
    attn = {stem for (t, node, stem) in got if t == 1 and node == "root.model.layers.0.self_attn"}
    # HF calls attention with keyword arguments only: msit sees none of these inputs
    assert {
        "input_hidden_states",
        "input_position_embeddings_0",
        "input_position_embeddings_1",
        "output_0",
    } <= attn
    root = {stem for (t, node, stem) in got if t == 0 and node == "root"}
    assert "output_logits" in root and "input_input_ids" in root  # ModelOutput field, kwarg
    assert not any("past_key_values" in stem for (_, _, stem) in got)  # Cache objects skipped
    logits = lwdump.load(run, got[2, "root", "output_logits"])
    head = lwdump.load(run, got[2, "root.lm_head", "output"])
    assert torch.equal(logits, head)


def test_every_data_file_is_valid_safetensors_matching_the_offsets(dumped):
    run, _, _ = dumped
    lines = [ln for ln in lwdump.index(run) if ln["k"] == "t"]
    by_file: dict[str, list] = {}
    for ln in lines:
        by_file.setdefault(ln["file"], []).append(ln)
    assert 1 <= len(by_file) <= 4 * NEW_TOKENS  # batched: few files, not one per tensor
    for name, group in by_file.items():
        with safe_open(str(run / name), "pt") as fh:
            keys = set(fh.keys())
            for ln in group:
                key = f"{ln['token']}/{ln['node']}/{ln['stem']}"
                tensor = lwdump.load(run, ln)
                if key in keys:
                    assert torch.equal(fh.get_tensor(key), tensor)
    assert not list(run.rglob(".tmp-*"))


def test_topology_has_tree_order_and_fingerprints(dumped, llama):
    run, _, _ = dumped
    topo = json.loads((run / "topology.json").read_text())
    assert topo["format"] == "layerwatch-topology" and topo["root"] == "root"
    nodes = {n["name"]: n for n in topo["nodes"]}
    assert len(nodes) == len(list(llama.named_modules()))
    down = nodes["root.model.layers.1.mlp.down_proj"]
    assert down["parent"] == "root.model.layers.1.mlp" and down["type"] == "Linear"
    assert nodes["root"]["order"] == max(n["order"] for n in nodes.values())
    assert (
        nodes["root.model.layers.0.mlp.down_proj"]["order"]
        < nodes["root.model.layers.0.mlp"]["order"]
    )
    w = llama.model.layers[1].mlp.down_proj.weight.detach().double()
    assert down["params"]["weight"]["abs_sum"] == pytest.approx(float(w.abs().sum()), rel=1e-12)
    assert nodes["root.model.layers.1"]["params"] == {}


def test_bf16_model_payloads_are_stored_as_bf16(llama, tmp_path):
    model = transformers.LlamaForCausalLM(llama.config).eval()
    model.load_state_dict(llama.state_dict())
    model = model.to(torch.bfloat16)
    ids = torch.tensor([[5, 6, 7]])
    with (
        register_hook(model, DumpConfig(dump_path=tmp_path, token_range=[0])) as handle,
        torch.no_grad(),
    ):
        out = model(ids)
    got = lwdump.tensors(handle.run_dir)
    line = got[0, "root.lm_head", "output"]
    assert line["dtype"] == "bfloat16"
    with safe_open(str(handle.run_dir / line["file"]), "pt") as fh:
        assert fh.get_slice("0/root.lm_head/output").get_dtype() == "BF16"
    assert torch.equal(lwdump.load(handle.run_dir, line), out.logits)


def test_attach_from_a_global_pre_hook_like_the_bootstrap(llama, dumped, tmp_path):
    """The zero-code-change bootstrap: a global pre-hook sees the root's first call (no kwargs)."""
    run, prompt, generated = dumped
    handles = []

    def global_pre(module, args):
        if not handles and module is llama:
            handles.append(
                register_hook(module, DumpConfig(dump_path=tmp_path), already_in_call=True)
            )

    token = torch.nn.modules.module.register_module_forward_pre_hook(global_pre)
    try:
        again = tiny_hf.generate(llama, prompt)
    finally:
        token.remove()
    handles[0].close()
    assert torch.equal(again, generated)
    live = lwdump.index(handles[0].run_dir)
    ids = {ln["token"]: ln["input_ids"] for ln in live if ln["k"] == "token"}
    assert ids[0] == prompt[0].tolist() and sorted(ids) == list(range(NEW_TOKENS))
    normal = lwdump.tensors(run)
    attached = lwdump.tensors(handles[0].run_dir)
    assert set(attached) == set(normal)
    for key in (
        (0, "root.model.layers.1.mlp.down_proj", "output"),
        (0, "root", "input_input_ids"),
        (NEW_TOKENS - 1, "root", "output_logits"),
    ):
        assert torch.equal(
            lwdump.load(handles[0].run_dir, attached[key]), lwdump.load(run, normal[key])
        )
