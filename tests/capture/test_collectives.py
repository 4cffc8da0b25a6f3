"""Collectives as captured nodes, in this process: a gloo group of one rank (a HashStore, no
port), so every collective runs for real and is cheap. torchrun with two ranks is
tests/engine/test_tensor_parallel.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from layerwatch.capture import DumpConfig, register_hook
from support import lwdump
from torch import nn

pytestmark = [
    pytest.mark.skipif(not dist.is_available(), reason="no torch.distributed"),
    pytest.mark.filterwarnings("ignore:.*is deprecated:FutureWarning"),  # *_tensor → *_single
]


@pytest.fixture
def group() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


class Collectives(nn.Module):
    """Every captured collective once, in a child module, plus an async all-reduce."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x)
        dist.all_reduce(y, op=dist.ReduceOp.MAX)
        dist.all_reduce(y, async_op=True).wait()
        gathered = torch.empty(4)
        dist.all_gather_into_tensor(gathered, y[0])
        parts = [torch.empty(4)]
        dist.all_gather(parts, y[1])
        scattered = torch.empty(2, 4)
        dist.reduce_scatter_tensor(scattered, y)
        dist.broadcast(scattered, src=0)
        return scattered + gathered + parts[0]


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Collectives()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


def test_collectives_become_nodes_with_input_before_and_output_after(
    group: None, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    model = Outer()
    original = dist.all_reduce
    with register_hook(model, DumpConfig(dump_path=tmp_path)) as handle, torch.no_grad():
        model(torch.randn(2, 4))
        assert dist.all_reduce is original  # wrapped only during the root call
    run = lwdump.rank_dir(tmp_path)
    assert run.name == "rank0" and handle.run_dir == run
    manifest = json.loads((run / "manifest.json").read_text())
    assert (manifest["rank"], manifest["world_size"], manifest["backend"]) == (0, 1, "gloo")
    tensors = lwdump.tensors(run)
    base = "root.block"
    nodes = {node for (_, node, _) in tensors if node.startswith(base + ".")}
    assert nodes >= {
        f"{base}.all_reduce.0",
        f"{base}.all_reduce.1",
        f"{base}.all_gather_into_tensor.0",
        f"{base}.all_gather.0",
        f"{base}.reduce_scatter_tensor.0",
        f"{base}.broadcast.0",
    }
    assert (0, f"{base}.all_gather.0", "output_0") in tensors
    ops = {x["node"]: x["op"] for x in lwdump.index(run) if x["k"] == "collective"}
    assert ops[f"{base}.all_reduce.0"] == "MAX" and ops[f"{base}.all_reduce.1"] == "SUM"
    assert ops[f"{base}.broadcast.0"] == "SRC0"
    # the collective completes before the module that called it
    order = {node: line["order"] for (_, node, _), line in tensors.items()}
    assert order[f"{base}.broadcast.0"] < order[base]


def test_a_wrapper_the_program_installs_is_part_of_the_collective(
    group: None, tmp_path: Path
) -> None:
    """The program wraps all_reduce *after* register_hook (a fault injector, a quantised
    all-reduce): the captured output is what the wrapper returned, the input what went in."""
    model = Outer()
    handle = register_hook(model, DumpConfig(dump_path=tmp_path))
    inner = dist.all_reduce

    def doubling(tensor: torch.Tensor, *args: object, **kwargs: object) -> object:
        out = inner(tensor, *args, **kwargs)
        tensor.mul_(2)
        return out

    dist.all_reduce = doubling
    try:
        with torch.inference_mode():  # no version counters: nothing is de-duplicated
            model(torch.ones(2, 4))
        with torch.no_grad():
            model(torch.ones(2, 4))
    finally:
        handle.close()
        dist.all_reduce = inner
    run = lwdump.rank_dir(tmp_path)
    tensors = lwdump.tensors(run)
    node = "root.block.all_reduce.0"
    for token in (0, 1):
        before = lwdump.load(run, tensors[(token, node, "input_0")])
        after = lwdump.load(run, tensors[(token, node, "output")])
        torch.testing.assert_close(after, 2 * before)
        # the module's output, modified in place by the call later, keeps its own copy
        inner_out = lwdump.load(run, tensors[(token, "root.block.inner", "output")])
        torch.testing.assert_close(inner_out, before)


def test_removing_the_hooks_restores_torch_distributed(group: None, tmp_path: Path) -> None:
    model = Outer()
    original = {n: getattr(dist, n) for n in ("all_reduce", "broadcast", "all_gather")}
    handle = register_hook(model, DumpConfig(dump_path=tmp_path))

    class Boom(RuntimeError):
        pass

    def explode(*_: object) -> None:
        assert dist.all_reduce is not original["all_reduce"]  # wrapped inside the call
        raise Boom

    hook = model.block.inner.register_forward_hook(explode)
    with pytest.raises(Boom), torch.no_grad():
        model(torch.ones(2, 4))
    hook.remove()
    handle.close()
    assert {n: getattr(dist, n) for n in original} == original


def test_a_plain_process_keeps_the_pid_directory(tmp_path: Path) -> None:
    with register_hook(nn.Linear(2, 2), DumpConfig(dump_path=tmp_path)) as handle:
        pass
    assert handle.run_dir is not None and handle.run_dir.name.startswith("cpu_")
    assert "rank" not in json.loads((handle.run_dir / "manifest.json").read_text())


def test_filters_apply_to_collective_nodes(group: None, tmp_path: Path) -> None:
    """``layer_name`` globs select collective nodes by name; ``tensor_part=0`` keeps inputs."""
    model = Outer()
    config = DumpConfig(dump_path=tmp_path, layer_name="*all_reduce*", tensor_part=0)
    with register_hook(model, config), torch.no_grad():
        model(torch.ones(2, 4))
    tensors = lwdump.tensors(lwdump.rank_dir(tmp_path))
    assert {(node, stem) for (_, node, stem) in tensors} == {
        ("root.block.all_reduce.0", "input_0"),
        ("root.block.all_reduce.1", "input_0"),
    }
