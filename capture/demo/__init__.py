"""The demo inference program: a tiny Llama-style model with named faults.

Python API::

    from layerwatch.capture.demo import build_model, generate, make_prompt, FAULTS, DEFAULT_FAULT
    golden = build_model()                                   # fp32, no fault
    target = build_model(dtype="bf16", fault=DEFAULT_FAULT)  # same weights, one broken operator
    ids = generate(target, make_prompt(), new_tokens=16)     # greedy, KV cache, deterministic

Command line: ``python -m layerwatch.capture.demo [--dtype fp32|bf16|fp16] [--fault NAME]
[--new-tokens N] [--prompt-len P] [--layers L] [--dump DIR]``. ``to_hf(model)`` in
``layerwatch.capture.demo.hf`` builds the Hugging Face ``LlamaForCausalLM`` with the same weights.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..errors import LayerwatchError
from .faults import DEFAULT_FAULT, FAULTS, Fault, apply_fault
from .model import DTYPES, DemoConfig, Transformer, init_weights

PROMPT_LEN = 16
NEW_TOKENS = 16
PROMPT_SEED = 7

__all__ = [
    "DEFAULT_FAULT",
    "FAULTS",
    "NEW_TOKENS",
    "PROMPT_LEN",
    "DemoConfig",
    "Fault",
    "Transformer",
    "build_model",
    "generate",
    "make_prompt",
]


def build_model(
    *,
    dtype: str = "fp32",
    fault: str | None = None,
    layers: int | None = None,
    config: DemoConfig | None = None,
) -> Transformer:
    """The demo model with its fixed random weights, cast to ``dtype``, with ``fault`` armed."""
    if dtype not in DTYPES:
        raise LayerwatchError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    cfg = config or DemoConfig()
    if layers is not None:
        if layers < 1:
            raise LayerwatchError(f"--layers must be at least 1, got {layers}")
        cfg = replace(cfg, n_layers=layers)
    model = Transformer(cfg)
    init_weights(model)
    if fault not in (None, "", "none"):
        apply_fault(model, fault)
    return model.to(DTYPES[dtype]).eval()


def make_prompt(
    length: int = PROMPT_LEN, *, vocab_size: int | None = None, seed: int = PROMPT_SEED
) -> torch.Tensor:
    """Fixed random prompt ids, shape ``[1, length]``."""
    if length < 1:
        raise LayerwatchError(f"the prompt needs at least one token, got {length}")
    vocab = vocab_size or DemoConfig().vocab_size
    return torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def generate(
    model: Transformer, prompt: torch.Tensor | None = None, new_tokens: int = NEW_TOKENS
) -> torch.Tensor:
    """Greedy decoding with the KV cache: ``new_tokens`` forward calls (prefill + decode steps).

    Returns prompt and generated ids, ``[1, P + new_tokens]``. Token numbering (and so the
    faults' start tokens) restarts at 0 with each call.
    """
    if prompt is None:
        prompt = make_prompt(vocab_size=model.cfg.vocab_size)
    if prompt.shape[1] + new_tokens > model.cfg.max_seq_len:
        raise LayerwatchError(f"prompt + new tokens must fit in {model.cfg.max_seq_len} positions")
    model.ctx.step = 0
    ids = prompt
    logits = model(prompt, 0)
    for i in range(new_tokens):
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
        if i + 1 < new_tokens:
            logits = model(nxt, prompt.shape[1] + i)
    return ids
