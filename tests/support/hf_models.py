"""The zoo's models: transformers' own small ``*ForCausalLM`` per architecture, and prompts.

Random weights are transformers' initialisation under a seed; trained ones come from
``hf_train.py``. Byte-level vocabulary, so trained models can be prompted with real text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .hf_train import BOS, corpus_bytes, trained_state

ARCHS = ("llama", "qwen2", "mistral", "gemma", "gpt2")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
VOCAB = 256  # byte-level: token id = byte value
LAYERS = 3
HIDDEN = 64  # mistral: 96


def _llama_like(cls_name: str, **shape: Any) -> Callable[[str], Any]:
    """Shapes differ per arch on purpose (head_dim, GQA ratio, MLP width) to vary the reductions."""

    def make(attn: str) -> Any:
        import transformers

        args: dict[str, Any] = {
            "hidden_size": HIDDEN,
            "intermediate_size": 176,
            "num_hidden_layers": LAYERS,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": VOCAB,
            "max_position_embeddings": 256,
            "attn_implementation": attn,
        }
        return getattr(transformers, cls_name)(**{**args, **shape})

    return make


def _gpt2(attn: str) -> Any:
    import transformers

    return transformers.GPT2Config(
        n_embd=HIDDEN,
        n_layer=LAYERS,
        n_head=4,
        vocab_size=VOCAB,
        n_positions=256,
        bos_token_id=0,
        eos_token_id=0,
        resid_pdrop=0.0,  # no dropout while training (the others have none either)
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        attn_implementation=attn,
    )


_CONFIGS: dict[str, Callable[[str], Any]] = {
    "llama": _llama_like("LlamaConfig"),
    "qwen2": _llama_like("Qwen2Config"),
    "mistral": _llama_like(
        "MistralConfig",
        hidden_size=96,
        intermediate_size=256,
        num_attention_heads=6,
        sliding_window=None,
    ),
    "gemma": _llama_like("GemmaConfig", head_dim=32, intermediate_size=192),
    "gpt2": _gpt2,
}
_CLASSES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gpt2": "GPT2LMHeadModel",
}


def _check_arch(arch: str) -> None:
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; one of {', '.join(ARCHS)}")


def config_for(arch: str, attn: str = "eager") -> Any:
    """The small transformers config of ``arch`` (byte vocabulary, 3 layers, 4–6 heads)."""
    _check_arch(arch)
    return _CONFIGS[arch](attn)


def layer_prefix(arch: str, layer: int) -> str:
    """Module path of decoder layer ``layer`` (``model.layers.1``, GPT-2: ``transformer.h.1``)."""
    _check_arch(arch)
    return f"transformer.h.{layer}" if arch == "gpt2" else f"model.layers.{layer}"


def build(
    arch: str, *, trained: bool = False, seed: int = 0, attn: str = "eager"
) -> torch.nn.Module:
    """transformers' ``*ForCausalLM`` for ``arch`` in fp32 and eval mode.

    Random weights are transformers' own initialisation under ``torch.manual_seed(seed)``;
    ``trained=True`` loads (training once, then caching) weights from ``hf_train.trained_state``.
    """
    import transformers

    config = config_for(arch, attn)
    torch.manual_seed(seed * 100 + ARCHS.index(arch))  # no two archs share initial weights
    model = getattr(transformers, _CLASSES[arch])(config)
    if trained:
        state = trained_state(arch, config, seed=seed, make=lambda: build(arch, seed=seed))
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [m for m in missing if not m.endswith(("inv_freq", "lm_head.weight"))]
        if missing or unexpected:
            raise RuntimeError(f"trained state of {arch}: missing {missing}, extra {unexpected}")
        model.tie_weights()
    model.eval()
    model.zoo_info = {"arch": arch, "trained": trained, "seed": seed}  # read by faults' probes
    return model


def prompt_ids(arch: str, n: int = 12, seed: int = 0, *, trained: bool = False) -> torch.Tensor:
    """``[1, n]`` int64 prompt: random bytes, or for trained models a slice of real text."""
    _check_arch(arch)
    if trained:  # the start byte the model was trained with, then held-out text
        text = corpus_bytes(held_out=True)
        start = (seed * 7919) % (len(text) - n)
        return torch.tensor([[BOS, *text[start : start + n - 1]]], dtype=torch.int64)
    gen = torch.Generator().manual_seed(1000 + seed)
    return torch.randint(0, VOCAB, (1, n), generator=gen, dtype=torch.int64)
