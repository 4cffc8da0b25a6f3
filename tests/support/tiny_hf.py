"""Tiny random-weight Hugging Face models (Llama, Qwen2, GPT-2) captured with ``register_hook``.

Nothing is downloaded: each model is built from a small config with a fixed seed, cast to the
asked dtype, and run through ``generate`` (prefill + decode steps) under capture. The helpers
below edit the model before the run, as a bug in a kernel or a checkpoint would, so tests can
check that a compare or ``layerwatch scan`` finds the node where the damage starts.

The one home of these builders: tests/fixtures/tiny_llama.py (the fixture generators, run in
side venvs without layerwatch, so nothing here imports layerwatch at module level) and
tests/capture/test_hf_llama.py build their Llama here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from layerwatch.capture import DumpConfig

ARCHS = ("llama", "qwen2", "gpt2")
SEED = 1234
VOCAB = 97
PROMPT = 6
NEW_TOKENS = 4

MLP_IN = {
    "llama": "model.layers.1.mlp.up_proj",
    "qwen2": "model.layers.1.mlp.up_proj",
    "gpt2": "transformer.h.1.mlp.c_fc",
}
"""The first projection of layer 1's MLP (a weight whose scale blows the activations up)."""
ACT = {
    "llama": "model.layers.1.mlp.act_fn",
    "qwen2": "model.layers.1.mlp.act_fn",
    "gpt2": "transformer.h.1.mlp.act",
}
"""Layer 1's activation module (replaced by a NaN-producing op in the NaN fault)."""


def build(arch: str, dtype: torch.dtype = torch.float32, *, vocab: int = VOCAB) -> nn.Module:
    """``arch`` with 2 layers of width 32, weights from :data:`SEED` (same seed, same weights)."""
    import transformers

    torch.manual_seed(SEED)
    common = dict(vocab_size=vocab, attn_implementation="eager")
    if arch == "gpt2":
        cfg = transformers.GPT2Config(
            n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0, **common
        )
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cls_cfg, cls = {
            "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
            "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        }[arch]
        cfg = cls_cfg(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            **common,
        )
        model = cls(cfg)
    return model.eval().to(dtype)


def prompt() -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(3))


def generate(model: nn.Module, ids: torch.Tensor | None = None) -> torch.Tensor:
    ids = prompt() if ids is None else ids
    with torch.no_grad():
        return model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
        )


def capture(
    model: nn.Module, out: Path, config: DumpConfig | None = None, run: Callable | None = None
) -> Path:
    """Generate under capture into ``out``; returns the rank directory."""
    from layerwatch.capture import DumpConfig, register_hook

    config = config or DumpConfig(dump_path=out)
    with register_hook(model, config) as handle:
        (run or generate)(model)
    assert handle.run_dir is not None
    return handle.run_dir


class Lambda(nn.Module):
    """A module computing ``fn(x)`` (a stand-in for a faulty kernel)."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


def set_module(model: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent), name, module)


def scale_weight(model: nn.Module, path: str, factor: float) -> None:
    with torch.no_grad():
        model.get_submodule(path).weight.mul_(factor)


def add_weight_noise(model: nn.Module, path: str, share: float, seed: int = 99) -> None:
    """Gaussian noise of ``share`` × the weight's std (a seeded generator: the same fault each time)."""
    weight = model.get_submodule(path).weight
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        weight.add_(torch.randn(weight.shape, generator=gen) * weight.std() * share)
