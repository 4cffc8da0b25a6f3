"""Grid columns: the repeated container is found by structure, for 1 to 12 layers."""

from __future__ import annotations

import pytest
from layerwatch.engine.records import Topology
from layerwatch.engine.session.blocks import find_layers, layout_for, topology_from_names


def torch_topology(model: object, *args: object) -> Topology:
    """Module tree of a real torch model with completion order from forward hooks."""
    import torch

    assert isinstance(model, torch.nn.Module)
    topo = Topology()
    names = {id(m): ("root." + n if n else "root") for n, m in model.named_modules()}
    order: dict[str, int] = {}

    def record(module: object, _args: object, _out: object) -> None:
        order.setdefault(names[id(module)], len(order))

    hooks = [m.register_forward_hook(record) for m in model.modules()]
    with torch.no_grad():
        model(*args)
    for hook in hooks:
        hook.remove()
    for path, module in model.named_modules():
        name = "root." + path if path else "root"
        parent = None if not path else ("root." + path.rsplit(".", 1)[0] if "." in path else "root")
        topo.add(name, type(module).__name__, parent, order.get(name, -1))
    return topo


def hf_llama(layers: int) -> tuple[object, object]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(config).eval()
    return model, torch.tensor([[1, 2, 3, 4]])


@pytest.mark.parametrize("layers", [1, 2, 12])
def test_hf_llama_layers_found_for_any_count(layers: int) -> None:
    model, ids = hf_llama(layers)
    layout = layout_for(torch_topology(model, ids))
    labels = [b.label for b in layout.blocks]
    assert layout.container == "root.model.layers"
    # rotary_emb is declared after norm but runs before the layers: execution order decides.
    assert labels == ["embed", "rotary", *[f"L{i}" for i in range(layers)], "norm", "lm_head"]
    assert [b.kind for b in layout.blocks] == ["pre", "pre", *["layer"] * layers, "post", "post"]
    assert layout.block_of("root.model.layers.0.mlp.down_proj") == 2
    assert layout.block_of("root.model.layers.0.self_attn.q_proj", "input") == 2
    # containers on the path: outputs go to the last column, inputs to the first
    assert layout.block_of("root", "output") == len(labels) - 1
    assert layout.block_of("root.model", "input") == 0
    assert layout.block_of("root.model.embed_tokens") == 0


def test_toy_model_blocks(toy: object) -> None:
    layout = layout_for(toy.topology())  # type: ignore[attr-defined]
    assert [b.label for b in layout.blocks] == ["embed", "L0", "L1", "L2", "norm", "lm_head"]


def test_leaf_groups_never_win_over_two_layers() -> None:
    """Four Linear leaves in an attention, three in an MLP: still the 2 layers are the layers."""
    nodes = {"root": ("M", 20), "root.embed": ("Embedding", 0)}
    order = 1
    for i in range(2):
        for leaf in ("attn.q", "attn.k", "attn.v", "attn.o", "mlp.a", "mlp.b", "mlp.c"):
            nodes[f"root.layers.{i}.{leaf}"] = ("Linear", order)
            order += 1
        nodes[f"root.layers.{i}.attn"] = ("Attn", order)
        nodes[f"root.layers.{i}.mlp"] = ("MLP", order + 1)
        nodes[f"root.layers.{i}"] = ("Block", order + 2)
        order += 3
    nodes["root.head"] = ("Linear", order)
    container, layers = find_layers(topology_from_names(nodes))
    assert container == "root.layers"
    assert layers == ["root.layers.0", "root.layers.1"]


def test_experts_inside_two_layers_do_not_win() -> None:
    nodes: dict[str, tuple[str, int]] = {}
    order = 0
    for i in range(2):
        for e in range(8):
            nodes[f"root.h.{i}.moe.experts.{e}.w1"] = ("Linear", order)
            nodes[f"root.h.{i}.moe.experts.{e}"] = ("Expert", order + 1)
            order += 2
        nodes[f"root.h.{i}"] = ("GPTBlock", order)
        order += 1
    container, layers = find_layers(topology_from_names(nodes))
    assert container == "root.h"
    assert len(layers) == 2


def test_layers_sort_numerically() -> None:
    nodes = {f"root.blocks.{i}.ff": ("Linear", i) for i in range(12)}
    nodes.update({f"root.blocks.{i}": ("Block", 100 + i) for i in range(12)})
    _, layers = find_layers(topology_from_names(nodes))
    assert layers == [f"root.blocks.{i}" for i in range(12)]


def test_no_layers_one_column_per_child() -> None:
    nodes = {"root.conv": ("Conv", 0), "root.fc": ("Linear", 1), "root": ("Net", 2)}
    layout = layout_for(topology_from_names(nodes))
    assert layout.container is None
    assert [b.label for b in layout.blocks] == ["conv", "fc"]
    assert layout.block_of("root", "output") == 1


def test_without_orders_declaration_decides_pre_and_post() -> None:
    topo = Topology()
    topo.add("root", "M")
    for name in ("embed", "layers", "norm"):
        topo.add(f"root.{name}", "X", "root")
    for i in range(3):
        topo.add(f"root.layers.{i}", "Block", "root.layers")
        topo.add(f"root.layers.{i}.fc", "Linear", f"root.layers.{i}")
    layout = layout_for(topo)
    assert [(b.label, b.kind) for b in layout.blocks] == [
        ("embed", "pre"),
        ("L0", "layer"),
        ("L1", "layer"),
        ("L2", "layer"),
        ("norm", "post"),
    ]


def test_unknown_nodes_fall_back_to_name_pattern(toy: object) -> None:
    layout = layout_for(toy.topology())  # type: ignore[attr-defined]
    # an API-level node under a known module resolves through its parent
    assert layout.block_of("root.model.layers.2.self_attn.matmul") == 3
    # a node the topology does not have at all, named like a layer
    assert layout.block_of("other.layers.1.x") == 2
    assert layout.block_of("nowhere") == -1
