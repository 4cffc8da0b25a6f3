"""``layerwatch precheck``: each operator recomputed in float64 from its own dumped inputs.

The zoo's kernel faults (``tests/support/hf_faults.py``: a forward that scales its output by
2 %, a norm that uses another eps than its attribute, Gemma's (1+w) ported as w, an embedding
gather one row off) leave every weight and attribute intact, so only recomputation finds
them; each must be found at its exact (token, node) in bf16 and fp16, and benign dumps must
raise nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from layerwatch.engine.numerics import precheck as ref
from layerwatch.engine.precheck import precheck
from support import atb, hf_zoo

pytest.importorskip("transformers")

FAULT_CASES = [
    (arch, fault)
    for arch in ("llama", "qwen2", "gemma", "gpt2")
    for fault in ("kernel_scale", "kernel_eps", "embedding_shift")
] + [("gemma", "gemma_plus_one")]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "layerwatch.tui.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize(("arch", "fault"), FAULT_CASES)
def test_each_kernel_fault_is_found_at_its_token_and_node(arch, fault, dtype, tmp_path):
    spec = hf_zoo.FAULTS[fault](arch)
    dump = hf_zoo.capture(arch, tmp_path, dtype=dtype, fault=fault, dump_weight=True)
    report = precheck(dump)
    first = report.first_failure
    assert first is not None, f"{fault} not found"
    assert (first.key.token, first.key.node) == (spec.from_token, spec.node)
    assert {r.key.node for r in report.failed} == {spec.node}  # nothing else is blamed
    assert first.metrics[ref.PRECHECK_RATIO] > 2.0  # found with a margin, not at the edge


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("arch", hf_zoo.ARCHS)
def test_benign_dumps_raise_nothing(arch, dtype, tmp_path):
    report = precheck(hf_zoo.capture(arch, tmp_path, dtype=dtype, dump_weight=True))
    assert report.checked > 50 and not report.errors
    assert not report.failed, [(r.key.token, r.key.node, r.reason) for r in report.failed[:3]]
    worst = max(r.metrics[ref.PRECHECK_RATIO] for r in report.rows)
    assert worst < 0.6  # the limits keep a margin over benign rounding


@pytest.mark.parametrize("arch", ["llama", "gemma", "gpt2"])
def test_benign_trained_weights_raise_nothing(arch, tmp_path):
    for dtype in ("bf16", "fp16"):
        report = precheck(
            hf_zoo.capture(arch, tmp_path / dtype, dtype=dtype, trained=True, dump_weight=True)
        )
        assert report.checked > 50 and not report.failed and not report.errors


def test_cli_json_shape_exit_codes_and_csv(tmp_path):
    dump = hf_zoo.capture(
        "llama", tmp_path / "bad", dtype="bf16", fault="kernel_scale", dump_weight=True
    )
    out = tmp_path / "report.csv"
    done = _cli("precheck", str(dump), "--json", "-o", str(out))
    assert done.returncode == 1, done.stderr
    obj = json.loads(done.stdout)
    assert set(obj) >= {"summary", "first_failure", "rows"}
    assert obj["summary"]["failed"] >= 1 and obj["summary"]["checked"] > 50
    assert obj["summary"]["unsupported"]["LlamaAttention"] > 0  # counted, never guessed
    first = obj["first_failure"]
    assert (first["token"], first["node"]) == (1, "root.model.layers.1.mlp.down_proj")
    assert first["tensor"] == "output" and "norm" in first["reason"]
    tokens = [(r["token"]) for r in obj["rows"]]
    assert tokens == sorted(tokens)  # execution order: token first
    lines = out.read_text().splitlines()
    assert lines[0].startswith("token,node,type,tensor,verdict,precheck_ratio")
    assert len(lines) == 1 + len(obj["rows"])
    jsonl = tmp_path / "report.jsonl"  # the -o rule every command shares (engine/outcome.py)
    assert _cli("precheck", str(dump), "-o", str(jsonl)).returncode == 1
    lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert len(lines) == 1 + len(obj["rows"]) and lines[-1]["summary"] == obj["summary"]
    clean = hf_zoo.capture("llama", tmp_path / "ok", dtype="bf16", dump_weight=True)
    done = _cli("precheck", str(clean), "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["first_failure"] is None


def test_a_dump_without_weights_says_how_to_capture_them(tmp_path):
    dump = hf_zoo.capture("qwen2", tmp_path, dtype="bf16")
    done = _cli("precheck", str(dump))
    assert done.returncode == 2
    assert "--weights" in done.stderr and "dump_weight=True" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_truncated_files_give_error_rows_or_exit_2(tmp_path):
    dump = hf_zoo.capture("llama", tmp_path, dtype="bf16", dump_weight=True)
    data = sorted((dump / "data").iterdir())
    for path in data:  # cut every data file short: nothing can be checked
        os.truncate(path, 200)
    done = _cli("precheck", str(dump))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "truncated" in done.stderr


def test_older_dumps_without_classes_count_as_unsupported(tmp_path):
    dump = hf_zoo.capture("llama", tmp_path, dtype="fp32", dump_weight=True)
    topo_path = dump / "topology.json"
    topo = json.loads(topo_path.read_text())
    for node in topo["nodes"]:
        node.pop("class", None)
        node.pop("attrs", None)
    topo_path.write_text(json.dumps(topo))
    done = _cli("precheck", str(dump), "--json")
    assert done.returncode == 2 and "nothing could be checked" in done.stderr


def test_a_pure_scale_error_is_seen_by_the_norm_figure_not_by_cosine():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 256))
    w = rng.standard_normal((256, 64)) / 16
    reference = ref.matmul(x, w, None)
    target = ref.round_to(reference.values, "bfloat16")
    assert ref.judge(target, reference, "bfloat16").ok
    scaled = ref.judge(ref.round_to(reference.values * 1.02, "bfloat16"), reference, "bfloat16")
    assert not scaled.ok
    assert scaled.metrics["cosine_similarity"] > 0.99999
    assert scaled.metrics[ref.NORM_RATIO] > 4 * ref.NORM_LIMIT


def test_round_to_bfloat16_matches_the_atb_writer():
    values = np.array([1.0, 1.00390625, 1.005859375, -3.14159, 1e-3])
    bits = atb.bf16_bits(values.astype(np.float32)).astype(np.uint32) << 16
    assert np.array_equal(
        ref.round_to(values, "bfloat16"), bits.view(np.float32).astype(np.float64)
    )


def _atb_ops(scale: float = 1.0, eps_used: float = 1e-6) -> list[atb.Op]:
    rng = np.random.default_rng(3)
    bf = lambda a: ref.round_to(np.asarray(a, np.float64), "bfloat16").astype(np.float32)  # noqa: E731
    x = bf(rng.standard_normal((5, 64)))
    gamma = bf(1 + 0.1 * rng.standard_normal(64))
    xd = x.astype(np.float64)
    normed = bf(xd / np.sqrt((xd**2).mean(-1, keepdims=True) + eps_used) * gamma)
    w = bf(rng.standard_normal((96, 64)) / 8)
    lin = bf(normed.astype(np.float64) @ w.astype(np.float64).T * scale)
    act = bf(lin * (1 / (1 + np.exp(-lin.astype(np.float64)))))
    added = bf(act.astype(np.float64) + lin)
    return [
        atb.Op("RmsNormOperation", [x, gamma], [normed], dtype="bfloat16"),
        atb.Op("LinearOperation", [normed, w], [lin], dtype="bfloat16"),
        atb.Op("ActivationOperation", [lin], [act], dtype="bfloat16"),
        atb.Op("ElewiseOperation", [act, lin], [added], dtype="bfloat16"),
        atb.Op("SelfAttentionOperation", [lin], [lin], dtype="bfloat16"),
    ]


_ATB_PARAMS = {
    "RmsNormOperation": {"layerType": 1, "normParam": {"epsilon": 1e-6}},
    "LinearOperation": {"transposeA": False, "transposeB": True, "hasBias": False},
    "ActivationOperation": {"activationType": 4},
    "ElewiseOperation": {"elewiseType": 8},
}


def _atb_dump(path, ops):
    root = atb.write_dump(path, [ops])
    for i, op in enumerate(ops):
        params = _ATB_PARAMS.get(op.op_type)
        if params is not None:
            op_dir = root / "tensors" / "0_4242" / "0" / f"{i}_{op.op_type}"
            (op_dir / "op_param.json").write_text(json.dumps(params))
    return root


def test_atb_linear_rmsnorm_activation_elewise_from_op_param(tmp_path):
    report = precheck(_atb_dump(tmp_path / "ok", _atb_ops()))
    assert report.checked == 4 and not report.failed, [r.reason for r in report.failed]
    assert report.unsupported == {"SelfAttentionOperation": 1}
    scaled = precheck(_atb_dump(tmp_path / "scaled", _atb_ops(scale=1.02)))
    assert scaled.first_failure is not None
    assert scaled.first_failure.node_type == "LinearOperation"
    eps = precheck(_atb_dump(tmp_path / "eps", _atb_ops(eps_used=0.05)))
    assert eps.first_failure is not None and eps.first_failure.node_type == "RmsNormOperation"


def test_compare_operator_view_carries_the_target_ops_precheck_verdict(tmp_path):
    from support.sessions import compare_dumps

    golden, target = hf_zoo.golden_and_target(
        "llama", tmp_path, dtype="bf16", fault="kernel_scale", dump_weight=True
    )
    from layerwatch.engine.precheck import precheck_sentence

    session = compare_dumps(golden, target)
    session.operator_check = precheck_sentence  # as the TUI front ends set it (frontends._session)
    results = session.results()
    node = "root.model.layers.1.mlp.down_proj"
    bad = next(
        r for r in results if r.key.node == node and r.key.token == 1 and r.key.stem == "output"
    )
    assert "precheck: the target op is wrong on its own inputs" in session.explain(bad).sentence
    fine = next(
        r for r in results if r.key.node == node and r.key.token == 0 and r.key.stem == "output"
    )
    assert "recomputes within rounding" in session.explain(fine).sentence


def test_zero_code_dump_with_weights_then_precheck(tmp_path):
    script = tmp_path / "infer.py"
    script.write_text(
        "import torch\n"
        "torch.manual_seed(0)\n"
        "m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU('tanh'),\n"
        "    torch.nn.LayerNorm(32), torch.nn.Dropout(0.1), torch.nn.Softmax(-1)).to(torch.bfloat16).eval()\n"
        "with torch.no_grad():\n"
        "    for _ in range(2):\n"
        "        m(torch.randn(3, 16, dtype=torch.bfloat16))\n"
    )
    out = tmp_path / "dump"
    done = _cli("dump", "--out", str(out), "--weights", "--", sys.executable, str(script))
    assert done.returncode == 0, done.stderr
    (run,) = [p for p in out.iterdir() if p.is_dir() and (p / "index.jsonl").exists()]
    assert any('"k":"weight"' in line.replace(" ", "") for line in (run / "index.jsonl").open())
    done = _cli("precheck", str(out), "--json")
    assert done.returncode == 0, done.stderr + done.stdout
    obj = json.loads(done.stdout)
    assert obj["summary"]["checked"] == 10 and obj["summary"]["failed"] == 0
    assert obj["summary"]["unsupported"] == {"Sequential": 2}


def test_subclasses_are_not_guessed_and_bad_paths_are_one_line(tmp_path):
    import torch
    from layerwatch.capture import DumpConfig, register_hook

    class ScaledLinear(torch.nn.Linear):  # same attributes as nn.Linear, another computation
        def forward(self, x):
            return super().forward(x) * 1.5

    model = torch.nn.Sequential(ScaledLinear(8, 8), torch.nn.ReLU()).eval()
    with (
        register_hook(model, DumpConfig(dump_path=tmp_path / "d", dump_weight=True)),
        torch.no_grad(),
    ):
        model(torch.randn(2, 8))
    report = precheck(tmp_path / "d")
    assert report.unsupported["ScaledLinear"] == 1 and report.checked == 1 and not report.failed
    for args in (
        ("precheck", str(tmp_path / "missing")),
        ("precheck", str(tmp_path / "d"), "-o", "r.txt"),
    ):
        done = _cli(*args)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr


def test_headless_open_of_one_dump_is_precheck(tmp_path):
    dump = hf_zoo.capture("gemma", tmp_path, dtype="fp16", fault="gemma_plus_one", dump_weight=True)
    done = _cli("open", str(dump), "--headless", "--json")
    assert done.returncode == 1, done.stderr
    first = json.loads(done.stdout)["first_failure"]
    assert (first["token"], first["node"]) == (0, "root.model.layers.1.input_layernorm")


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_the_demo_models_norm_is_rechecked(dtype, tmp_path):
    """The demo model's RMSNorm (capture/demo/model.py, Llama's ``w · cast(x̂)``) is checked:
    its ``rmsnorm_eps`` fault (eps 0.5 in layers.1.ffn_norm from token 2) is found there and
    nowhere else, and the benign run raises nothing."""
    from layerwatch.capture import DumpConfig, register_hook
    from layerwatch.capture.demo import build_model, generate

    reports = {}
    for fault in (None, "rmsnorm_eps"):
        model = build_model(dtype=dtype, fault=fault)
        out = tmp_path / str(fault)
        with register_hook(model, DumpConfig(dump_path=str(out), dump_weight=True)):
            generate(model, new_tokens=6)
        reports[fault] = precheck(out)
    benign = reports[None]
    norms = [r for r in benign.rows if r.key.node.endswith("_norm")]
    assert norms and all(r.verdict.value == "pass" for r in norms)
    assert not benign.failed and not benign.errors
    first = reports["rmsnorm_eps"].first_failure
    assert first is not None and (first.key.token, first.key.node) == (2, "root.layers.1.ffn_norm")
    assert {r.key.node for r in reports["rmsnorm_eps"].failed} == {"root.layers.1.ffn_norm"}
    assert first.metrics[ref.PRECHECK_RATIO] > 2.0
