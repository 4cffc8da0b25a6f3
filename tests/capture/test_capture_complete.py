"""Every tensor a capture takes lands on disk exactly once, at its token, in completion order,
with its own bytes and statistics: checked against an independent set of plain torch hooks that
clone what each module receives and returns. Small batch files, a short flush interval and
aliases whose bytes arrive later (an outer module's inputs) exercise the writer's batching,
chunk cuts, deferred lines and the index tails it builds beside the data file."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from layerwatch.capture import DumpConfig, register_hook
from support import lwdump, writers
from torch import nn


class Scale(nn.Module):
    def forward(self, x):
        return x * 1.5


class AddInPlace(nn.Module):
    """Modifies its input: the capture must hold the input as it was before."""

    def forward(self, x):
        return x.add_(1.0)


class Split(nn.Module):
    def forward(self, x):
        return x[:40] * 1.0, x[40:] * 2.0


class Join(nn.Module):
    def forward(self, parts):
        return torch.cat(parts)


class Poison(nn.Module):
    """NaN and Inf at odd tokens: lines whose statistics are not finite."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        y = x * 1.0
        if self.calls % 2 == 0:
            y[3] = float("nan")
            y[5] = float("inf")
        return y


class Block(nn.Module):
    """Its input is also its first child's input: that child's line is an alias of bytes the
    block's own input line brings, queued only when the block completes."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = Scale()
        self.split = Split()
        self.join = Join()

    def forward(self, x):
        return self.join(self.split(self.scale(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.add = AddInPlace()
        self.poison = Poison()

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.poison(self.add(x * 1.0))


class Oracle:
    """Plain torch hooks: (token, order, node, stem) -> a clone, taken when the hook runs."""

    def __init__(self, model: nn.Module) -> None:
        self.token = -1
        self.order = 0
        self.inputs: dict[str, list[tuple[str, torch.Tensor]]] = {}
        self.seen: dict[tuple[int, str, str], tuple[int, torch.Tensor]] = {}
        for name, module in model.named_modules():
            node = "root" if not name else f"root.{name}"
            module.register_forward_pre_hook(lambda m, args, node=node: self.pre(node, args))
            module.register_forward_hook(lambda m, a, out, node=node: self.post(node, out))

    def pre(self, node: str, args: tuple) -> None:
        if node == "root":
            self.token += 1
            self.order = 0
        (x,) = args
        if isinstance(x, tuple):
            self.inputs[node] = [(f"input_0_{i}", t.clone()) for i, t in enumerate(x)]
        else:
            self.inputs[node] = [("input_0", x.clone())]

    def post(self, node: str, out: object) -> None:
        taken = self.inputs.pop(node)
        if isinstance(out, tuple):
            taken += [(f"output_{i}", t.clone()) for i, t in enumerate(out)]
        else:
            taken.append(("output", out.clone()))
        for stem, t in taken:
            self.seen[self.token, node, stem] = (self.order, t)
        self.order += 1


def _stats(t: torch.Tensor) -> dict[str, object]:
    """What the index says about ``t`` (``capture/stats.py``): over its finite part."""
    v = t.double().numpy().ravel()
    finite = v[np.isfinite(v)]
    nan, inf = int(np.isnan(v).sum()), int(np.isinf(v).sum())
    return {
        "max": float(finite.max()),
        "min": float(finite.min()),
        "mean": float(finite.mean()),
        "norm": float(np.sqrt((finite * finite).sum())),
        "nan": nan,
        "inf": inf,
    }


@pytest.mark.parametrize("writer", writers.WRITERS)
def test_every_tensor_lands_once_in_order_with_its_bytes(tmp_path, monkeypatch, writer):
    # the writer thread, the writer process it feeds, or the thread, then the process
    writers.select(monkeypatch, writer, spawn_after=40)
    torch.manual_seed(0)
    model = Net()
    config = DumpConfig(dump_path=tmp_path, batch_bytes=1500, flush_interval=0.001)
    handle = register_hook(model, config)
    assert hasattr(handle._writer, "local") == (writer != "thread")
    oracle = Oracle(model)  # after register_hook: its hooks see what the capture's saw
    tokens = 12
    with torch.no_grad():
        for _ in range(tokens):
            model(torch.randn(64))
    handle.close()
    assert not getattr(handle._writer, "local", False)  # the process did write it
    assert getattr(handle._writer, "remote", False) == (writer != "thread")
    run = handle.run_dir
    lines = lwdump.index(run)
    files = {line["file"] for line in lines if line["k"] == "t"}
    assert len(files) > tokens, "small batch files: tokens are cut across several"

    # the file order: each token's line, then that token's tensor lines only
    current = -1
    for line in lines:
        if line["k"] == "token":
            assert line["token"] == current + 1
            current = line["token"]
        elif line["k"] == "t":
            assert line["token"] == current, "a tensor line outside its token"

    got = lwdump.tensors(run)  # asserts no (token, node, stem) twice
    assert set(got) == set(oracle.seen), "lost or invented tensors"
    for key, (order, want) in oracle.seen.items():
        line = got[key]
        assert line["order"] == order, key
        on_disk = lwdump.load(run, line)
        assert on_disk.dtype == want.dtype and on_disk.shape == want.shape, key
        assert torch.equal(on_disk.isnan(), want.isnan()), key
        assert torch.equal(on_disk.nan_to_num(), want.nan_to_num()), key
        stats, expected = line["stats"], _stats(want)
        for name, value in expected.items():
            written = stats[name]
            if isinstance(written, str):  # non-finite values are written as strings
                written = float(written)
            assert math.isclose(written, value, rel_tol=1e-6, abs_tol=1e-9), (key, name)
    odd = [got[t, "root.poison", "output"]["stats"] for t in range(1, tokens, 2)]
    assert all(s["nan"] == 1 and s["inf"] == 1 for s in odd), "the non-finite lines"
    in_place = got[0, "root.add", "input_0"]
    assert not torch.equal(
        lwdump.load(run, in_place), lwdump.load(run, got[0, "root.add", "output"])
    )
