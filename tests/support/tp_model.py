"""A toy Megatron-style tensor-parallel model, and the script that runs it (one card or torchrun).

Each layer is ``up`` (column-parallel Linear: this rank's rows of the weight, output sharded
on the last dim) → ``act`` → ``down`` (row-parallel Linear: this rank's columns, a partial sum
that ``torch.distributed.all_reduce`` completes inside its forward) → residual. Embedding and
head are replicated. The full weights come from one seed, so every world size computes the
same function (up to summation order) and a single-card run is the golden of a TP run.

Run as a script (``python tests/support/tp_model.py OUT`` or under ``torchrun``): greedy decode
of a few steps with ``register_hook`` (``--hook api``) or under ``layerwatch dump``
(``--hook none``). Faults: ``--fault allreduce`` (the program's own wrapper corrupts rank 1's
all-reduce result of layer 1 at token 1), ``--fault shard`` (rank 1 loads rank 0's ``up`` shard
of layer 1).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

VOCAB, HIDDEN, FFN, LAYERS = 32, 16, 64, 2
PROMPT = [3, 1, 4, 1, 5]


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class ColumnParallelLinear(nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class RowParallelLinear(nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if _world()[1] > 1:
            dist.all_reduce(y)  # looked up at call time: a capture's wrapper sees it
        return y


class Block(nn.Module):
    def __init__(self, up: torch.Tensor, down: torch.Tensor) -> None:
        super().__init__()
        self.up = ColumnParallelLinear(up)
        self.act = nn.GELU()
        self.down = RowParallelLinear(down)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(x)))


class TPModel(nn.Module):
    def __init__(self, rank: int = 0, world: int = 1, wrong_shard: bool = False) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        with torch.no_grad():
            self.embed.weight.copy_(torch.randn(VOCAB, HIDDEN, generator=gen))
        part = FFN // world
        layers = []
        for i in range(LAYERS):
            up = torch.randn(FFN, HIDDEN, generator=gen) / HIDDEN**0.5
            down = torch.randn(HIDDEN, FFN, generator=gen) / FFN**0.5
            lo = (0 if wrong_shard and i == 1 else rank) * part
            layers.append(
                Block(up[lo : lo + part].clone(), down[:, rank * part : (rank + 1) * part].clone())
            )
        self.layers = nn.ModuleList(layers)
        self.head = nn.Linear(HIDDEN, VOCAB)
        with torch.no_grad():
            self.head.weight.copy_(torch.randn(VOCAB, HIDDEN, generator=gen) / HIDDEN**0.5)
            self.head.bias.zero_()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def corrupt_allreduce(rank: int) -> None:
    """The program's own wrapper: rank 1's result of layer 1's all-reduce at token 1 is off."""
    inner = dist.all_reduce
    calls = [0]

    def all_reduce(tensor: torch.Tensor, *args: object, **kwargs: object) -> object:
        out = inner(tensor, *args, **kwargs)
        if rank == 1 and calls[0] == LAYERS + 1:
            tensor.mul_(1.05)
        calls[0] += 1
        return out

    dist.all_reduce = all_reduce


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--hook", choices=("api", "none"), default="api")
    ap.add_argument("--fault", choices=("none", "allreduce", "shard"), default="none")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
    rank, world = _world()
    model = TPModel(rank, world, wrong_shard=args.fault == "shard" and rank == 1).eval()
    handle = None
    if args.hook == "api":
        from layerwatch.capture import DumpConfig, register_hook

        handle = register_hook(model, DumpConfig(dump_path=args.out))
    if args.fault == "allreduce":
        corrupt_allreduce(rank)  # installed after register_hook: still part of what it sees
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        for _ in range(args.steps):
            logits = model(ids)
            ids = torch.cat([ids, logits[:, -1:].argmax(-1)], dim=1)
    if handle is not None:
        handle.close()
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
