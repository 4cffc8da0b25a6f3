"""A tiny stand-in for a user's inference script: imports nothing of layerwatch.

Builds a small seeded language model, "generates" N tokens greedily (one root forward call per
token, input ids passed as a keyword like HF models), prints the ids and exits with 0 — or with
``--exit-code`` after generating, or crashes in the middle with ``--crash-at``.
"""

import argparse
import sys
import time

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class TinyLM(nn.Module):
    def __init__(self, vocab=50, dim=16, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim) for _ in range(layers))
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids=None):
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--exit-code", type=int, default=0)
    parser.add_argument("--crash-at", type=int, default=-1)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument(
        "--fault-layer", type=int, default=-1, help="perturb this layer's last Linear"
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    model = TinyLM(dim=args.dim).eval()
    if args.fault_layer >= 0:
        with torch.no_grad():
            model.layers[args.fault_layer].mlp[2].weight.mul_(1.3)
    ids = torch.tensor([[1, 2, 3]])
    out = []
    with torch.no_grad():
        for step in range(args.tokens):
            if step == args.crash_at:
                raise RuntimeError(f"boom at token {step}")
            logits = model(input_ids=ids if step == 0 else ids[:, -1:])
            nxt = int(logits[0, -1].argmax())
            out.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
            time.sleep(args.sleep)
    print("generated", out)
    print("stderr line", file=sys.stderr)
    sys.exit(args.exit_code)


if __name__ == "__main__":
    main()
