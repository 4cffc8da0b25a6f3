"""Local verdicts (engine/numerics/local.py): few-percent faults in bf16/fp16 targets are found at
their exact (token, node); benign low-precision runs of the same models stay silent.

Real transformers models (tests/support/hf_zoo.py), golden fp32 eager, targets teacher-forced
onto the golden's ids. The global limits alone pass every bf16 fault here (the zoo's report,
tests/bench/zoo_report.py --faults); what finds them is the error each operator adds beyond
its own inputs'.
"""

from __future__ import annotations

import pytest
from layerwatch.engine.numerics.local import LocalLimit, local_figure, op_kind
from layerwatch.engine.records import INPUT_ERR, LOCAL, NORM_REL, RED
from support import hf_zoo, lwdump


@pytest.fixture(scope="module")
def zoo_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("local-zoo")


FAULTS = ("linear_noise", "v_proj_noise", "output_scale", "norm_eps")
CASES = [
    (arch, dtype, fault)
    for arch in ("llama", "qwen2", "gemma", "gpt2")
    for dtype in ("bf16", "fp16")
    for fault in FAULTS
]


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "dtype", "fault"), CASES)
def test_a_few_percent_fault_is_the_first_failure_at_its_token_and_node(
    zoo_dir, arch: str, dtype: str, fault: str
) -> None:
    spec = hf_zoo.FAULTS[fault](arch)
    golden, target = hf_zoo.golden_and_target(arch, zoo_dir, dtype=dtype, fault=fault)
    code, report = hf_zoo.compare_json(golden, target)
    first = report["first_failure"]
    assert code == 1 and first is not None
    assert (first["token"], first["node"]) == (spec.from_token, spec.node), first
    assert first["tensor"].startswith("output")
    if dtype == "bf16":  # the global bf16 limits pass these faults: the local verdict finds them
        assert first["failed_metrics"] == [LOCAL], first
        row = next(
            r
            for r in report["rows"]
            if (r["token"], r["node"], r["tensor"])
            == (first["token"], first["node"], first["tensor"])
        )
        assert "introduces" in row["reason"] and row["metrics"][LOCAL] > 1.0


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["output_scale", "norm_eps"])
def test_trained_weights_bf16_scale_and_eps_faults_are_found(zoo_dir, fault: str) -> None:
    spec = hf_zoo.FAULTS[fault]("llama")
    golden, target = hf_zoo.golden_and_target(
        "llama", zoo_dir, dtype="bf16", fault=fault, trained=True
    )
    _, report = hf_zoo.compare_json(golden, target)
    first = report["first_failure"]
    assert first is not None and (first["token"], first["node"]) == (spec.from_token, spec.node)


BENIGN = [(arch, "fp32", "sdpa", False) for arch in hf_zoo.ARCHS] + [
    (arch, dtype, "eager", True) for arch in ("llama", "gpt2") for dtype in ("bf16", "fp16")
]


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "dtype", "attn", "trained"), BENIGN)
def test_benign_runs_raise_nothing_and_rows_carry_the_local_figure(
    zoo_dir, arch: str, dtype: str, attn: str, trained: bool
) -> None:
    """Random-weight bf16/fp16 runs of all five archs are checked in tests/capture/test_hf_zoo.py."""
    golden, target = hf_zoo.golden_and_target(
        arch, zoo_dir, dtype=dtype, attn=attn, trained=trained, new_tokens=6, seed=2
    )
    code, report = hf_zoo.compare_json(golden, target)
    assert code == 0 and report["first_failure"] is None, report["first_failure"]
    judged = [r for r in report["rows"] if LOCAL in r["metrics"]]
    types = {ln["node"]: ln["type"] for ln in lwdump.index(target) if ln["k"] == "t"}
    kinds = {op_kind(types[r["node"]]) for r in judged}
    assert {"linear", "norm", "embedding"} <= kinds  # every leaf kind of these models is judged
    assert all(INPUT_ERR in r["metrics"] and r["metrics"][LOCAL] <= 1.0 for r in judged)


LIMIT = LocalLimit(red_gain=2.0, red=1.0, scale_gain=2.0, scale=3.0)
U = 2.0**-8


def test_local_figure_measures_what_the_operator_adds() -> None:
    clean_in = [{RED: 0.004, NORM_REL: 1e-5}]
    same = local_figure({RED: 0.006, NORM_REL: 1e-5}, clean_in, "bf16", LIMIT)
    assert same is not None and not same.failed and same.input_error == 0.004
    noisy = local_figure({RED: 0.04, NORM_REL: 1e-5}, clean_in, "bf16", LIMIT)
    assert noisy is not None and noisy.failed and noisy.part == "noise"
    assert noisy.ratio == pytest.approx((0.04 - 2 * 0.004) / U / 1.0)
    scaled = local_figure({RED: 0.03, NORM_REL: 0.03}, [{RED: 0.02, NORM_REL: 1e-4}], "bf16", LIMIT)
    assert scaled is not None and scaled.failed and scaled.part == "scale"  # RED alone: 0.03 < 0.04


def test_local_figure_needs_inputs_and_finite_figures() -> None:
    assert local_figure({RED: 0.1, NORM_REL: 0.1}, [], "bf16", LIMIT) is None
    assert (
        local_figure({RED: 0.1, NORM_REL: 0.1}, [{RED: 0.0, NORM_REL: 0.0}], "int", LIMIT) is None
    )
    nan = float("nan")
    assert (
        local_figure({RED: nan, NORM_REL: 0.0}, [{RED: 0.0, NORM_REL: 0.0}], "bf16", LIMIT) is None
    )


@pytest.mark.parametrize(
    ("node_type", "kind"),
    [
        ("Linear", "linear"),
        ("Conv1D", "linear"),
        ("LlamaRMSNorm", "norm"),
        ("GemmaRMSNorm", "norm"),
        ("LayerNorm", "norm"),
        ("SiLUActivation", "activation"),
        ("NewGELUActivation", "activation"),
        ("Embedding", "embedding"),
        ("GemmaTextScaledWordEmbedding", "embedding"),
        ("LlamaRotaryEmbedding", "rotary"),
        ("LlamaDecoderLayer", "layer"),
        ("GPT2Block", "layer"),
        ("Qwen2Attention", "attention"),
        ("LlamaMLP", "mlp"),
        ("KVCache", "other"),
    ],
)
def test_op_kinds(node_type: str, kind: str) -> None:
    assert op_kind(node_type) == kind
