"""A plain bf16 inference script for ``precheck --replay``: a tiny transformers Llama (the zoo's),
greedy generation with a KV cache.

``python hf_replay.py benign|eps|noisy [TOKENS [ARCH [DTYPE]]]`` (default 8 llama bf16; the
faults are Llama's): ``eps`` swaps LlamaRMSNorm's forward for one
that uses eps 1e-2 whatever the module says (a wrong kernel of every norm); ``noisy`` makes
layer 1's ``down_proj`` add 2 % noise to its output (one wrong Linear instance).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from support import hf_zoo

mode = sys.argv[1]
tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 8
arch = sys.argv[3] if len(sys.argv) > 3 else "llama"
dtype = hf_zoo.DTYPES[sys.argv[4] if len(sys.argv) > 4 else "bf16"]
torch.set_num_threads(1)
model = hf_zoo.build(arch).to(dtype)
if mode == "eps":
    from transformers.models.llama import modeling_llama

    def wrong_eps(self: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        dtype = hidden.dtype
        h = hidden.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-2)
        return self.weight * h.to(dtype)

    modeling_llama.LlamaRMSNorm.forward = wrong_eps
elif mode == "noisy":
    down = model.model.layers[1].mlp.down_proj
    gen = torch.Generator().manual_seed(7)

    def noisy(x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.linear(x, down.weight)
        noise = torch.randn(y.shape, generator=gen).to(y.dtype)
        return y + 0.02 * y.float().std().to(y.dtype) * noise

    down.forward = noisy
ids = hf_zoo.prompt_ids(arch)
with torch.no_grad():
    out = model.generate(ids, max_new_tokens=tokens, do_sample=False, min_new_tokens=tokens)
print("generated", out.shape[1] - ids.shape[1], flush=True)
