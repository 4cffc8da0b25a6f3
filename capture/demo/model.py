"""A tiny Llama-style decoder in plain torch, every operator a module so hooks see it.

Module names follow Meta's Llama reference (``tok_embeddings``, ``layers.N.attention.wq``...,
``layers.N.feed_forward.w1``..., ``attention_norm``, ``ffn_norm``, ``norm``, ``output``), not
Hugging Face's, so pairing it with ``LlamaForCausalLM`` needs the weight-based mapping. The
numerics follow Hugging Face's eager Llama exactly (rotate-half RoPE, float32 RMSNorm, float32
softmax) so the same weights give the same logits (``capture/demo/hf.py``).

Each operator a fault may break is its own module with a ``fault`` slot
(``capture/demo/faults.py``); ``ctx.step`` is the token being computed (0 = prefill), so a
fault starts at a known token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class DemoConfig:
    dim: int = 64
    n_layers: int = 6
    n_heads: int = 4
    n_kv_heads: int = 2
    vocab_size: int = 256
    ffn_dim: int = 176
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_seq_len: int = 256
    seed: int = 1234
    sharp_layer: int = 4
    """This layer's wq/wk are 1.5x larger: peaked attention, as real models have somewhere
    (the fp16 softmax fault needs scores that overflow an fp16 ``exp``)."""

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


class Ctx:
    """Shared by the modules of one model: the token being computed."""

    def __init__(self) -> None:
        self.step = 0


class Faultable(nn.Module):
    """A module a named fault can break from ``fault.start_token`` on."""

    def __init__(self, ctx: Ctx) -> None:
        super().__init__()
        self.ctx = ctx
        self.fault: Any = None

    def faulty(self) -> bool:
        return self.fault is not None and self.ctx.step >= self.fault.start_token


class Linear(Faultable):
    """``nn.Linear`` without bias (type name ``Linear``); the noisy-weight fault adds noise."""

    noise: torch.Tensor | None

    def __init__(self, ctx: Ctx, fan_in: int, fan_out: int) -> None:
        super().__init__(ctx)
        self.weight = nn.Parameter(torch.empty(fan_out, fan_in))
        self.register_buffer("noise", None, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight: torch.Tensor = self.weight
        if self.faulty() and self.noise is not None:
            weight = weight + self.noise
        return F.linear(x, weight)


class RMSNorm(Faultable):
    def __init__(self, ctx: Ctx, dim: int, eps: float) -> None:
        super().__init__(ctx)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        eps = self.fault.eps if self.faulty() else self.eps
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return self.weight * h.to(dtype)


def rotate_half(x: torch.Tensor, swapped: bool = False) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x2, -x1) if swapped else (-x2, x1), dim=-1)


class RotaryEmbedding(Faultable):
    """Hugging Face's rotate-half RoPE on (q, k); the rotary fault swaps the halves."""

    inv_freq: torch.Tensor

    def __init__(self, ctx: Ctx, head_dim: int, theta: float) -> None:
        super().__init__(ctx)
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, start_pos: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(start_pos, start_pos + q.shape[2], dtype=torch.float)
        freqs = pos[:, None] * self.inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(q.dtype), emb.sin().to(q.dtype)
        swapped = self.faulty()
        return (q * cos + rotate_half(q, swapped) * sin, k * cos + rotate_half(k, swapped) * sin)


class KVCache(Faultable):
    """Appends this step's keys/values and returns all of them; the fault writes one slot early."""

    k: torch.Tensor | None
    v: torch.Tensor | None

    def __init__(self, ctx: Ctx, max_seq_len: int) -> None:
        super().__init__(ctx)
        self.max_seq_len = max_seq_len
        self.register_buffer("k", None, persistent=False)
        self.register_buffer("v", None, persistent=False)

    def forward(
        self, k: torch.Tensor, v: torch.Tensor, start_pos: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.k, self.v
        if start_pos == 0 or keys is None or values is None:
            shape = (k.shape[0], k.shape[1], self.max_seq_len, k.shape[3])
            keys = self.k = torch.zeros(shape, dtype=k.dtype, device=k.device)
            values = self.v = torch.zeros(shape, dtype=v.dtype, device=v.device)
        end = start_pos + k.shape[2]
        slot = start_pos - 1 if self.faulty() and start_pos > 0 else start_pos
        keys[:, :, slot : slot + k.shape[2]] = k
        values[:, :, slot : slot + v.shape[2]] = v
        return keys[:, :, :end], values[:, :, :end]


class AttentionScores(nn.Module):
    """Raw scores ``q @ k^T`` plus the causal mask (the scale is applied inside the softmax)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, start_pos: int) -> torch.Tensor:
        scores = torch.matmul(q, k.transpose(2, 3))
        t, s = q.shape[2], k.shape[2]
        if t > 1:
            mask = torch.full((t, s), float("-inf"), dtype=scores.dtype).triu(start_pos + 1)
            scores = scores + mask
        return scores


class ScaledSoftmax(Faultable):
    """Fused scale + softmax in float32; the fault exponentiates the unscaled scores in fp16."""

    def __init__(self, ctx: Ctx, scale: float) -> None:
        super().__init__(ctx)
        self.scale = scale

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        if self.faulty():  # exp(x)^scale == exp(scale*x), but exp(x) overflows fp16 above 11.1
            e = torch.exp(scores.to(torch.float16)) ** self.scale
            return (e / e.sum(-1, keepdim=True)).to(scores.dtype)
        return F.softmax(scores.float() * self.scale, dim=-1).to(scores.dtype)


class AttentionContext(nn.Module):
    def forward(self, probs: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.matmul(probs, v)


class Attention(nn.Module):
    def __init__(self, ctx: Ctx, cfg: DemoConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = Linear(ctx, cfg.dim, cfg.n_heads * cfg.head_dim)
        self.wk = Linear(ctx, cfg.dim, cfg.n_kv_heads * cfg.head_dim)
        self.wv = Linear(ctx, cfg.dim, cfg.n_kv_heads * cfg.head_dim)
        self.wo = Linear(ctx, cfg.n_heads * cfg.head_dim, cfg.dim)
        self.rope = RotaryEmbedding(ctx, cfg.head_dim, cfg.rope_theta)
        self.cache = KVCache(ctx, cfg.max_seq_len)
        self.scores = AttentionScores()
        self.softmax = ScaledSoftmax(ctx, cfg.head_dim**-0.5)
        self.context = AttentionContext()

    def forward(self, x: torch.Tensor, start_pos: int) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = self.rope(q, k, start_pos)
        keys, values = self.cache(k, v, start_pos)
        groups = self.n_heads // self.n_kv
        keys = keys.repeat_interleave(groups, dim=1)
        values = values.repeat_interleave(groups, dim=1)
        probs = self.softmax(self.scores(q, keys, start_pos))
        out = self.context(probs, values).transpose(1, 2).contiguous().view(b, t, -1)
        return self.wo(out)


class FeedForward(nn.Module):
    def __init__(self, ctx: Ctx, cfg: DemoConfig) -> None:
        super().__init__()
        self.w1 = Linear(ctx, cfg.dim, cfg.ffn_dim)
        self.w2 = Linear(ctx, cfg.ffn_dim, cfg.dim)
        self.w3 = Linear(ctx, cfg.dim, cfg.ffn_dim)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.act(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, ctx: Ctx, cfg: DemoConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(ctx, cfg.dim, cfg.norm_eps)
        self.attention = Attention(ctx, cfg)
        self.ffn_norm = RMSNorm(ctx, cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(ctx, cfg)

    def forward(self, x: torch.Tensor, start_pos: int) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), start_pos)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """The demo model. ``forward(tokens, start_pos)`` returns the logits of every position."""

    def __init__(self, cfg: DemoConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.ctx = Ctx()
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(TransformerBlock(self.ctx, cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(self.ctx, cfg.dim, cfg.norm_eps)
        self.output = Linear(self.ctx, cfg.dim, cfg.vocab_size)

    def forward(self, tokens: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, start_pos)
        logits = self.output(self.norm(h))
        self.ctx.step += 1
        return logits


def init_weights(model: Transformer) -> None:
    """Deterministic random weights from ``cfg.seed``, independent of the global RNG.

    Unit-scale activations (weights ~ N(0, 1/fan_in)) and norm weights 1 + N(0, 0.1²), so that
    every module's parameters are distinct (weight-based pairing must not find ties).
    """
    cfg = model.cfg
    gen = torch.Generator().manual_seed(cfg.seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=gen))
            elif param.dim() == 2 and "tok_embeddings" in name:
                param.copy_(torch.randn(param.shape, generator=gen))
            else:
                param.copy_(torch.randn(param.shape, generator=gen) / math.sqrt(param.shape[1]))
        if 0 <= cfg.sharp_layer < cfg.n_layers:
            block = model.layers[cfg.sharp_layer]
            assert isinstance(block, TransformerBlock)
            attn = block.attention
            attn.wq.weight.mul_(1.5)
            attn.wk.weight.mul_(1.5)
