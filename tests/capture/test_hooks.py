"""register_hook on small hand-made models: what is captured, when, and under which name."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json

import numpy as np
import pytest
import torch
from layerwatch.capture import DumpConfig, register_hook
from support import lwdump
from torch import nn


class AddOneInPlace(nn.Module):
    """Mutates its input in place: the dump must hold the value it was called with."""

    def forward(self, x):
        x.add_(1.0)
        return x


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inc = AddOneInPlace()
        self.lin = nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)
        self.tail = nn.Linear(4, 3)

    def forward(self, ids, scale=None):
        x = ids.float().unsqueeze(-1).expand(-1, -1, 4).clone()
        x = self.inc(x)
        y = self.lin(x)  # lin's output is then modified in place by the ReLU
        y = self.act(y)
        return self.tail(y * (1.0 if scale is None else scale))


def _net(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net().eval()


def test_inputs_are_taken_before_in_place_ops_and_outputs_before_later_ones(tmp_path):
    net = _net()
    ids = torch.tensor([[1, 2, 3]])
    with register_hook(net, DumpConfig(dump_path=tmp_path)) as handle:
        net(ids)
    run = handle.run_dir
    got = lwdump.tensors(run)
    expected_in = ids.float().unsqueeze(-1).expand(-1, -1, 4)
    assert torch.equal(lwdump.load(run, got[0, "root.inc", "input_0"]), expected_in)  # pre-mutation
    assert torch.equal(lwdump.load(run, got[0, "root.inc", "output"]), expected_in + 1)
    lin_out = net.lin(expected_in + 1)
    assert (lin_out < 0).any()  # otherwise the ReLU test proves nothing
    assert torch.allclose(lwdump.load(run, got[0, "root.lin", "output"]), lin_out)  # before ReLU
    assert torch.allclose(lwdump.load(run, got[0, "root.act", "input_0"]), lin_out)
    assert torch.allclose(lwdump.load(run, got[0, "root.act", "output"]), lin_out.relu())


def test_keyword_inputs_dataclass_and_dict_outputs(tmp_path):
    @dataclasses.dataclass
    class Out:
        logits: torch.Tensor
        extra: tuple

    class KwNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(2, 2)

        def forward(self, x, *, bias=None, pair=(None, None), flag=True):
            y = self.inner(x) + bias
            return Out(logits=y, extra=(y * 2, {"z": y * 3, "skip": 7}))

    net = KwNet()
    x = torch.ones(1, 2)
    with register_hook(net, DumpConfig(dump_path=tmp_path)) as handle:
        net(x, bias=torch.full((2,), 0.5), pair=(x * 4, None), flag=False)
    got = lwdump.tensors(handle.run_dir)
    stems = {stem for (_, node, stem) in got if node == "root"}
    assert stems == {
        "input_0",
        "input_bias",
        "input_pair_0",
        "output_logits",
        "output_extra_0",
        "output_extra_1_z",
    }
    y = net.inner(x) + 0.5
    assert torch.allclose(lwdump.load(handle.run_dir, got[0, "root", "output_extra_1_z"]), y * 3)
    assert torch.equal(lwdump.load(handle.run_dir, got[0, "root", "input_pair_0"]), x * 4)


def test_a_view_is_saved_as_its_own_elements_not_its_storage(tmp_path):
    class Slicer(nn.Module):
        def forward(self, x):
            return x[:, 3:5].t()  # a strided view into a 64x64 storage

    class Top(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.s = Slicer()

        def forward(self, x):
            return self.s(x) * 1.0

    base = torch.arange(64 * 64, dtype=torch.float32).reshape(64, 64)
    top = Top()
    with register_hook(top, DumpConfig(dump_path=tmp_path)) as handle:
        top(base)
    line = lwdump.tensors(handle.run_dir)[0, "root.s", "output"]
    assert line["end"] - line["begin"] == 2 * 64 * 4  # payload only: 128 floats
    assert torch.equal(lwdump.load(handle.run_dir, line), base[:, 3:5].t())
    data_bytes = sum(p.stat().st_size for p in (handle.run_dir / "data").iterdir())
    assert data_bytes < 2 * base.numel() * 4  # the input once + small stuff, no storage copies


def test_token_counting_order_and_input_ids(tmp_path):
    net = _net()
    with register_hook(net, DumpConfig(dump_path=tmp_path)) as handle:
        for step in range(3):
            net(torch.tensor([[step, step + 1]]))
    lines = lwdump.index(handle.run_dir)
    tokens = [ln for ln in lines if ln["k"] == "token"]
    assert [t["token"] for t in tokens] == [0, 1, 2]
    assert tokens[2]["input_ids"] == [2, 3]
    assert lines[-1] == {
        "k": "end",
        "status": "complete",
        "tokens": 3,
        "tensors": lines[-1]["tensors"],
    }
    got = lwdump.tensors(handle.run_dir)
    orders = {
        node: got[1, node, "output"]["order"]
        for node in ("root.inc", "root.lin", "root.act", "root.tail", "root")
    }
    assert orders == {"root.inc": 0, "root.lin": 1, "root.act": 2, "root.tail": 3, "root": 4}
    topo = json.loads((handle.run_dir / "topology.json").read_text())
    by_name = {n["name"]: n for n in topo["nodes"]}
    assert by_name["root.tail"]["order"] == 3 and by_name["root.tail"]["parent"] == "root"
    w = net.tail.weight.detach().double()
    fp = by_name["root.tail"]["params"]["weight"]
    assert fp["shape"] == [3, 4] and fp["dtype"] == "float32"
    assert fp["sum"] == pytest.approx(float(w.sum()), rel=1e-12)
    assert fp["norm"] == pytest.approx(float(w.norm()), rel=1e-12)
    assert fp["head"] == pytest.approx(w.reshape(-1)[:16].tolist())
    manifest = json.loads((handle.run_dir / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["tokens"] == 3


def test_two_models_are_two_independent_runs_and_remove_really_removes(tmp_path):
    a, b = _net(1), _net(2)
    ha = register_hook(a, DumpConfig(dump_path=tmp_path / "a"))
    hb = register_hook(b, DumpConfig(dump_path=tmp_path / "b", tensor_part=1))
    ids = torch.tensor([[1, 2]])
    a(ids)
    b(ids)
    b(ids)
    hb.close()
    a(ids)
    ha.remove()
    before = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in a.modules())
    assert before == 0
    expected = a(ids)  # runs exactly as without layerwatch
    assert torch.equal(expected, _net(1)(ids))
    ha.close()
    ta = lwdump.tensors(ha.run_dir)
    tb = lwdump.tensors(hb.run_dir)
    assert {t for (t, _, _) in ta} == {0, 1} and {t for (t, _, _) in tb} == {0, 1}
    assert all(stem.startswith("output") for (_, _, stem) in tb)
    assert any(stem.startswith("input") for (_, _, stem) in ta)
    assert ha.on_disk and hb.on_disk


def test_attach_from_a_global_pre_hook_inside_the_first_call(tmp_path):
    """How the zero-code-change bootstrap attaches: inside the root's first forward call."""
    net = _net(3)
    reference = _net(3)
    ids = [torch.tensor([[1, 2, 3]]), torch.tensor([[4]]), torch.tensor([[5]])]
    handles = []

    def global_pre(module, args):
        if not handles and module is net:
            handles.append(
                register_hook(
                    module,
                    DumpConfig(dump_path=tmp_path / "live"),
                    already_in_call=True,
                    call_args=args,
                    call_kwargs={},
                )
            )

    token = torch.nn.modules.module.register_module_forward_pre_hook(global_pre)
    try:
        for x in ids:
            net(x)
    finally:
        token.remove()
    handles[0].close()
    with register_hook(reference, DumpConfig(dump_path=tmp_path / "ref")) as ref:
        for x in ids:
            reference(x)
    live, normal = lwdump.index(handles[0].run_dir), lwdump.index(ref.run_dir)

    def shape(lines):
        return [
            (
                ln["k"],
                ln.get("token"),
                ln.get("node"),
                ln.get("stem"),
                ln.get("order"),
                ln.get("input_ids"),
            )
            for ln in lines
            if ln["k"] in ("t", "token")
        ]

    assert sorted(shape(live), key=str) == sorted(shape(normal), key=str)
    lt, nt = lwdump.tensors(handles[0].run_dir), lwdump.tensors(ref.run_dir)
    for key in nt:
        assert torch.equal(
            lwdump.load(handles[0].run_dir, lt[key]), lwdump.load(ref.run_dir, nt[key])
        )


def test_attach_without_the_call_arguments_reads_them_at_the_end_of_the_call(tmp_path):
    net = _net(4)
    handles = []

    def global_pre(module, args):
        if not handles and module is net:
            handles.append(
                register_hook(module, DumpConfig(dump_path=tmp_path), already_in_call=True)
            )

    token = torch.nn.modules.module.register_module_forward_pre_hook(global_pre)
    try:
        net(torch.tensor([[7, 8]]))
        net(torch.tensor([[9]]))
    finally:
        token.remove()
    handles[0].close()
    lines = lwdump.index(handles[0].run_dir)
    ids = {ln["token"]: ln["input_ids"] for ln in lines if ln["k"] == "token"}
    assert ids == {0: [7, 8], 1: [9]}
    got = lwdump.tensors(handles[0].run_dir)
    assert lwdump.load(handles[0].run_dir, got[0, "root", "input_0"]).tolist() == [[7, 8]]
    assert got[0, "root", "output"]["order"] == got[0, "root", "input_0"]["order"]


def test_a_module_called_twice_in_a_token_gets_numbered_nodes(tmp_path):
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            return self.lin(self.lin(x))

    net = Twice()
    x = torch.ones(1, 2)
    with register_hook(net, DumpConfig(dump_path=tmp_path)) as handle:
        net(x)
    got = lwdump.tensors(handle.run_dir)
    first, second = got[0, "root.lin", "output"], got[0, "root.lin#1", "output"]
    assert torch.allclose(lwdump.load(handle.run_dir, first), net.lin(x))
    assert torch.allclose(lwdump.load(handle.run_dir, second), net(x))
    assert first["order"] < second["order"]


def test_statistics_match_numpy_on_the_finite_part(tmp_path):
    class Emit(nn.Module):
        def forward(self, x):
            return x

    class Top(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.e = Emit()

        def forward(self, xs):
            return [self.e(x) for x in xs]

    rng = np.random.default_rng(0)
    special = rng.standard_normal(1000).astype(np.float32)
    special[[3, 10]] = np.nan
    special[[5]] = np.inf
    special[[7]] = -np.inf
    xs = [
        torch.from_numpy(rng.standard_normal(300).astype(np.float32) * 5 + 2),
        torch.from_numpy(special),
        torch.from_numpy(rng.standard_normal(70000).astype(np.float32)),  # the large path
        torch.from_numpy(rng.standard_normal(512).astype(np.float32)).to(torch.bfloat16),
        torch.tensor([3, -4, 12], dtype=torch.int64),
        torch.full((4,), float("nan")),
        torch.zeros(0),
    ]
    top = Top()
    with register_hook(top, DumpConfig(dump_path=tmp_path)) as handle:
        top(xs)
    got = lwdump.tensors(handle.run_dir)
    for i, x in enumerate(xs):
        line = got[0, "root.e" if i == 0 else f"root.e#{i}", "output"]
        stats = line["stats"]
        values = x.double().numpy()
        finite = values[np.isfinite(values)]
        assert stats["nan"] == int(np.isnan(values).sum())
        assert stats["inf"] == int(np.isinf(values).sum())
        if finite.size:
            assert stats["max"] == pytest.approx(finite.max(), rel=1e-6)
            assert stats["min"] == pytest.approx(finite.min(), rel=1e-6)
            assert stats["mean"] == pytest.approx(finite.mean(), rel=1e-5, abs=1e-6)
            assert stats["norm"] == pytest.approx(np.linalg.norm(finite), rel=1e-5)
        else:
            assert stats["max"] == "nan" and stats["norm"] == 0.0
        assert torch.equal(
            lwdump.load(handle.run_dir, line).view(-1).view(torch.uint8),
            x.reshape(-1).view(torch.uint8),
        )


def test_a_script_that_never_closes_still_ends_with_a_complete_dump(tmp_path):
    """msit scripts call register_hook and exit: the interpreter's exit closes the capture."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from layerwatch.capture import DumpConfig, register_hook\n"
        "net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())\n"
        "register_hook(net, DumpConfig(dump_path=sys.argv[1]))\n"
        "for _ in range(3): net(torch.ones(2, 3))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and proc.stderr == ""
    run = lwdump.rank_dir(tmp_path)
    lines = lwdump.index(run)
    assert (
        lines[-1]["k"] == "end" and lines[-1]["status"] == "complete" and lines[-1]["tokens"] == 3
    )
    assert {t for (t, _, _) in lwdump.tensors(run)} == {0, 1, 2}
    assert json.loads((run / "manifest.json").read_text())["status"] == "complete"


def test_a_child_that_raises_inside_a_caught_exception_does_not_confuse_its_parent(tmp_path):
    class Fails(nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    class Parent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bad = Fails()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            with contextlib.suppress(ValueError):
                self.bad(x * 2)
            return self.lin(x)

    class Top(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.parent = Parent()

        def forward(self, x):
            return self.parent(x + 1)

    top = Top()
    x = torch.ones(1, 2)
    with register_hook(top, DumpConfig(dump_path=tmp_path)) as handle:
        top(x)
        top(x)
    got = lwdump.tensors(handle.run_dir)
    for token in (0, 1):
        assert torch.equal(lwdump.load(handle.run_dir, got[token, "root.parent", "input_0"]), x + 1)
        assert torch.equal(lwdump.load(handle.run_dir, got[token, "root", "input_0"]), x)
        assert (token, "root.parent.bad", "output") not in got


def test_complex_and_sparse_tensors_are_indexed_without_stopping_capture(tmp_path):
    class Rotary(nn.Module):  # Meta's reference Llama passes complex freqs_cis around
        def forward(self, x, freqs):
            return x * 2, freqs, torch.eye(3).to_sparse()

    class Top(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rot = Rotary()

        def forward(self, x):
            return self.rot(x, torch.polar(torch.ones(4), torch.arange(4.0)))[0]

    top = Top()
    with register_hook(top, DumpConfig(dump_path=tmp_path)) as handle:
        top(torch.ones(4))
        top(torch.ones(4))
    assert handle.failed is None
    got = lwdump.tensors(handle.run_dir)
    freqs = got[1, "root.rot", "input_1"]
    assert freqs["dtype"] == "complex64" and freqs["shape"] == [4] and freqs["file"] == ""
    assert got[1, "root.rot", "output_2"]["file"] == ""
    assert torch.equal(
        lwdump.load(handle.run_dir, got[1, "root.rot", "output_0"]), torch.full((4,), 2.0)
    )


class Twice(nn.Module):
    """Calls its child twice and itself recursively once: wrapped calls nest and number."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, *, depth=1, pair=False):
        y = self.lin(self.lin(x))
        if depth:
            y = self(y, depth=depth - 1)["y"]
        return {"y": y, "pair": (y, y + 1)} if not pair else (y, {"z": y * 2})


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.twice = Twice()
        self.hooked = nn.Linear(4, 4)

    def forward(self, x):
        y, extra = self.twice(x, pair=True)
        return self.hooked(y + extra["z"])


def test_wrapped_forwards_take_kwargs_containers_recursion_and_are_restored_exactly(tmp_path):
    torch.manual_seed(4)
    model = Outer().eval()
    own_forward = model.twice.lin.forward  # an instance attribute set before capture
    model.twice.lin.forward = own_forward
    seen = []
    user = model.hooked.register_forward_hook(lambda m, a, out: seen.append(out.clone()) or out * 3)
    x = torch.randn(2, 4)
    expected = model(x)
    signature = inspect.signature(model.twice.forward)
    with register_hook(model, DumpConfig(dump_path=tmp_path)) as handle:
        assert "forward" in vars(model.twice)  # wrapped: torch's fast path, no hook dicts
        assert not model.twice._forward_hooks and not model.twice._forward_pre_hooks
        assert len(model.hooked._forward_hooks) == 2  # the user's hook keeps torch's order
        assert inspect.signature(model.twice.forward) == signature
        got = model(x)
    assert torch.equal(got, expected)
    assert vars(model.twice.lin)["forward"] is own_forward and "forward" not in vars(model.twice)
    assert next(iter(model.hooked._forward_hooks.values())).__name__ == "<lambda>"
    assert len(model.hooked._forward_hooks) == 1 and not model.hooked._forward_pre_hooks
    user.remove()
    tensors = lwdump.tensors(handle.run_dir)
    names = {(node, stem) for (_, node, stem) in tensors}
    # outer call, then its recursive call (numbered in call order, like hooks)
    assert {("root.twice", "output_0"), ("root.twice", "output_1_z")} <= names
    assert {("root.twice#1", "output_y"), ("root.twice#1", "output_pair_1")} <= names
    assert {("root.twice.lin", "input_0"), ("root.twice.lin#3", "output")} <= names
    assert ("root.twice.lin#4", "output") not in names
    run = handle.run_dir
    inner = lwdump.load(run, tensors[0, "root.twice#1", "output_y"])
    assert torch.equal(lwdump.load(run, tensors[0, "root.twice", "output_0"]), inner)
    # torch's order kept: the user's hook, registered first, changed the output we capture
    assert torch.equal(lwdump.load(run, tensors[0, "root.hooked", "output"]), seen[-1] * 3)
