"""The Hugging Face ``LlamaForCausalLM`` with exactly the demo model's weights.

Tests (and the weight-based pairing test) compare the demo model against real Hugging Face code:
same numerics, different module names (``layers.0.attention.wq`` vs
``model.layers.0.self_attn.q_proj``). transformers is imported only when this is called.
"""

from __future__ import annotations

from typing import Any

import torch

from .model import Transformer

NAME_MAP = (
    ("tok_embeddings.weight", "model.embed_tokens.weight"),
    ("norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
)
LAYER_MAP = (
    ("attention.wq", "self_attn.q_proj"),
    ("attention.wk", "self_attn.k_proj"),
    ("attention.wv", "self_attn.v_proj"),
    ("attention.wo", "self_attn.o_proj"),
    ("feed_forward.w1", "mlp.gate_proj"),
    ("feed_forward.w3", "mlp.up_proj"),
    ("feed_forward.w2", "mlp.down_proj"),
    ("attention_norm", "input_layernorm"),
    ("ffn_norm", "post_attention_layernorm"),
)


def hf_name(demo_param: str) -> str:
    """``layers.2.feed_forward.w2.weight`` → ``model.layers.2.mlp.down_proj.weight``."""
    for ours, theirs in NAME_MAP:
        if demo_param == ours:
            return theirs
    head, _, rest = demo_param.partition(".")
    index, _, rest = rest.partition(".")
    if head == "layers":
        for ours, theirs in LAYER_MAP:
            if rest.startswith(ours + "."):
                return f"model.layers.{index}.{theirs}{rest[len(ours) :]}"
    raise KeyError(demo_param)


def hf_config(model: Transformer) -> Any:
    from transformers import LlamaConfig

    cfg = model.cfg
    return LlamaConfig(
        hidden_size=cfg.dim,
        intermediate_size=cfg.ffn_dim,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        vocab_size=cfg.vocab_size,
        rms_norm_eps=cfg.norm_eps,
        max_position_embeddings=cfg.max_seq_len,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
        attn_implementation="eager",
    )


def to_hf(model: Transformer) -> Any:
    """A ``LlamaForCausalLM`` (eager attention, same dtype) holding the demo model's weights."""
    from transformers import LlamaForCausalLM

    dtype = next(model.parameters()).dtype
    hf = LlamaForCausalLM(hf_config(model))
    state = {hf_name(name): p.detach().float() for name, p in model.named_parameters()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.endswith("rotary_emb.inv_freq")]
    if missing or unexpected:
        raise RuntimeError(f"weight mapping incomplete: missing {missing}, unexpected {unexpected}")
    return hf.to(dtype).eval()


@torch.no_grad()
def hf_generate(hf: Any, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy ``generate`` the way the demo does it (``new_tokens`` forward calls)."""
    return hf.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
    )
