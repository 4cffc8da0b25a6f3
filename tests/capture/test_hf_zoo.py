"""The Hugging Face zoo (``tests/support/hf_zoo.py``): real transformers models, captured and compared.

Other tests calibrate and check verdicts on these runs, so the zoo itself must hold: every
architecture captures in bf16 and fp16 and pairs completely with its fp32 golden, teacher
forcing really feeds the golden's ids, and each fault enters at exactly its node and token.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from support import hf_train, hf_zoo, lwdump

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def zoo_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("zoo")


def _token_ids(run) -> dict[int, list[int]]:
    return {ln["token"]: ln["input_ids"] for ln in lwdump.index(run) if ln["k"] == "token"}


ARCH_DTYPES = [(arch, dtype) for arch in hf_zoo.ARCHS for dtype in ("bf16", "fp16")]
"""GPT-2 in fp16 included: its additive causal mask (finfo(dtype).min on each side: -65504
against -3.4e38) is compared as the same masked value, not as numbers (compare.mask_fill)."""


@pytest.mark.parametrize(("arch", "dtype"), ARCH_DTYPES)
def test_every_arch_captures_and_pairs_with_its_golden(arch, dtype, zoo_dir):
    golden, target = hf_zoo.golden_and_target(arch, zoo_dir, dtype=dtype)
    code, report = hf_zoo.compare_json(golden, target)
    summary = report["summary"]
    assert summary["pairs"] > 300 and summary["unpaired"] == 0 and summary["error"] == 0
    assert summary["diverged"] == 0  # forced onto the golden's ids
    assert code == 0 and summary["fail"] == 0, report["first_failure"]  # benign random run
    dtypes = {ln["dtype"] for ln in lwdump.index(target) if ln["k"] == "t"}
    assert {"bfloat16": "bf16", "float16": "fp16"}.keys() & dtypes
    nodes = {row["node"] for row in report["rows"]}
    assert f"root.{hf_zoo.layer_prefix(arch, 2)}" in nodes and "root.lm_head" in nodes


def test_an_sdpa_target_pairs_all_but_what_sdpa_does_not_produce(zoo_dir):
    golden, target = hf_zoo.golden_and_target("mistral", zoo_dir, dtype="fp32", attn="sdpa")
    code, report = hf_zoo.compare_json(golden, target)
    assert code == 0 and report["summary"]["fail"] == 0 and report["summary"]["pairs"] > 300
    unpaired = {r["tensor"] for r in report["rows"] if r["verdict"] == "unpaired"}
    assert unpaired == {"output_1", "input_attention_mask"}  # eager's probabilities and mask


def test_dump_weight_puts_the_targets_own_weights_in_the_dump(zoo_dir):
    fault = hf_zoo.FAULTS["linear_noise"]("llama")
    _, target = hf_zoo.golden_and_target(
        "llama", zoo_dir, dtype="bf16", fault=fault.name, dump_weight=True
    )
    weights = {ln["name"]: ln for ln in lwdump.index(target) if ln["k"] == "weight"}
    line = weights[f"{fault.node}.weight"]
    assert line["dtype"] == "bfloat16"
    model = hf_zoo.build("llama").to(torch.bfloat16)
    fault.apply(model)
    noisy = model.get_submodule(fault.node[5:]).weight
    assert torch.equal(lwdump.load(target, line), noisy)  # the faulty weight, as the target ran


def test_forced_ids_feed_the_golden_ids_even_where_the_target_would_pick_others(zoo_dir):
    golden, target = hf_zoo.golden_and_target("qwen2", zoo_dir, dtype="fp32", fault="norm_eps")
    assert _token_ids(target) == _token_ids(golden)
    assert len(_token_ids(golden)) == 5  # prefill + 4 steps
    gold, faulty = hf_zoo.run_record(golden), hf_zoo.run_record(target)
    assert faulty["fed"] == gold["fed"] == [ids[0] for t, ids in _token_ids(golden).items() if t]
    free = hf_zoo.capture("qwen2", zoo_dir / "free", fault="embedding_shift")
    assert hf_zoo.run_record(free)["fed"] != gold["fed"]  # left alone, the fault changes the ids


def test_golden_and_target_reuse_their_cached_dumps(zoo_dir):
    first = hf_zoo.golden_and_target("gpt2", zoo_dir, dtype="bf16")
    stamps = [(p / "index.jsonl").stat().st_mtime_ns for p in first]
    again = hf_zoo.golden_and_target("gpt2", zoo_dir, dtype="bf16")
    assert again == first and [(p / "index.jsonl").stat().st_mtime_ns for p in again] == stamps
    other = hf_zoo.golden_and_target("gpt2", zoo_dir, dtype="fp16")
    assert other[0] == first[0] and other[1] != first[1]  # one golden serves every target


FAULT_CASES = [(f.arch, f.name) for arch in hf_zoo.ARCHS for f in hf_zoo.faults_for(arch)]


@pytest.mark.parametrize(("arch", "name"), FAULT_CASES)
def test_each_fault_enters_at_its_node_and_token(arch, name, zoo_dir):
    """fp32 golden vs fp32 faulty target: everything before the fault is bit-identical."""
    fault = hf_zoo.FAULTS[name](arch)
    golden, target = hf_zoo.golden_and_target(arch, zoo_dir, dtype="fp32", fault=name)
    assert hf_zoo.first_difference(golden, target) == (fault.from_token, fault.node)
    gold, bad = lwdump.tensors(golden), lwdump.tensors(target)
    for token in range(fault.from_token, 5):  # ... and it stays wrong at every later token
        out = (token, fault.node, "output")
        assert not torch.equal(lwdump.load(golden, gold[out]), lwdump.load(target, bad[out]))


@pytest.mark.parametrize(
    "name", ["kernel_scale", "kernel_eps", "gemma_plus_one", "embedding_shift"]
)
def test_kernel_faults_keep_weights_and_attributes_correct(name):
    fault = hf_zoo.FAULTS[name]("gemma")
    assert fault.kind == "kernel"
    clean, faulty = hf_zoo.build("gemma"), hf_zoo.build("gemma")
    fault.apply(faulty)
    module = faulty.get_submodule(fault.node.removeprefix("root."))
    assert "forward" in vars(module)  # the instance computes differently ...
    for key, value in clean.state_dict().items():  # ... while weights and attributes agree
        assert torch.equal(value, faulty.state_dict()[key]), key
    plain = {k: v for k, v in vars(clean.get_submodule(fault.node[5:])).items() if k != "forward"}
    assert {k: v for k, v in vars(module).items() if k in plain and not k.startswith("_")} == {
        k: v for k, v in plain.items() if not k.startswith("_")
    }


def test_weight_faults_show_in_the_weights_or_attributes():
    for name in ("linear_noise", "v_proj_noise", "norm_eps"):
        fault = hf_zoo.FAULTS[name]("llama")
        assert fault.kind == "weight"
        clean, faulty = hf_zoo.build("llama"), hf_zoo.build("llama")
        fault.apply(faulty)
        mod_c, mod_f = (m.get_submodule(fault.node[5:]) for m in (clean, faulty))
        differs = not torch.equal(mod_c.weight, mod_f.weight) or (
            mod_c.variance_epsilon != mod_f.variance_epsilon
        )
        assert differs, name


def test_unknown_names_are_refused_with_the_choices(zoo_dir):
    with pytest.raises(ValueError, match="llama"):
        hf_zoo.build("bert")
    with pytest.raises(ValueError, match="linear_noise"):
        hf_zoo.capture("llama", zoo_dir / "x", fault="nope")
    with pytest.raises(ValueError, match="gemma only"):
        hf_zoo.FAULTS["gemma_plus_one"]("llama")
    assert dataclasses.is_dataclass(hf_zoo.FAULTS["linear_noise"]("gpt2"))


def test_training_is_deterministic(monkeypatch):
    monkeypatch.setitem(hf_train.RECIPE, "steps", 3)
    states = []
    for _ in range(2):
        model = hf_zoo.build("llama")
        losses = hf_train.train(model)
        states.append((losses, model.state_dict()))
    assert states[0][0] == states[1][0] and states[0][0][-1] < states[0][0][0] + 0.5
    assert all(torch.equal(v, states[1][1][k]) for k, v in states[0][1].items())


def _outlier_ratio(model, ids) -> float:
    """max|x| / rms of the residual stream after the first decoder layer."""
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states[1]
    return float(hidden.abs().max() / hidden.pow(2).mean().sqrt())


@pytest.mark.slow  # trains once (~35 s of one CPU core) when the cache is cold
def test_trained_llama_has_outliers_and_a_benign_bf16_run_pairs(zoo_dir):
    trained = hf_zoo.build("llama", trained=True)
    info = hf_zoo.training_info("llama", hf_zoo.config_for("llama"))
    assert info is not None and sum(info["losses"][-50:]) / 50 < 2.0  # nats per byte
    ids = hf_zoo.prompt_ids("llama", 64, trained=True)
    assert bytes(ids[0].tolist()).isascii()  # real text
    random_ratio = _outlier_ratio(hf_zoo.build("llama"), ids)
    assert _outlier_ratio(trained, ids) > 1.4 * random_ratio  # measured 6.7 vs 4.0
    golden, target = hf_zoo.golden_and_target("llama", zoo_dir, dtype="bf16", trained=True)
    code, report = hf_zoo.compare_json(golden, target)
    assert report["summary"]["unpaired"] == 0 and report["summary"]["diverged"] == 0
    assert code in (0, 1)  # trained bf16 noise is what calibration must learn to accept
