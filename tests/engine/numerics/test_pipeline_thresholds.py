"""The default thresholds through the real pipeline: register_hook dumps of a tiny HF Llama,
the layerwatch reader, CompareSession. Benign targets raise no FAIL; a fault is the first
failure, at its operator, at its start token."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from layerwatch.capture import DumpConfig, register_hook
from layerwatch.engine.records import Verdict
from layerwatch.engine.session.core import CompareSession
from support.sessions import compare_dumps

transformers = pytest.importorskip("transformers")

NEW_TOKENS = 5
PROMPT = 8
FAULT_NODE = "root.model.layers.1.mlp.down_proj"


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(21)
    cfg = transformers.LlamaConfig(
        hidden_size=96,
        intermediate_size=256,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=211,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    return transformers.LlamaForCausalLM(cfg).eval()


def dump(
    model: torch.nn.Module, out: Path, feed: list[int] | None = None
) -> tuple[Path, list[int]]:
    """Greedy decode with a KV cache under register_hook; ``feed`` = teacher-forced ids."""
    ids = torch.randint(0, 211, (1, PROMPT), generator=torch.Generator().manual_seed(4))
    chosen: list[int] = []
    with register_hook(model, DumpConfig(dump_path=out)) as handle, torch.no_grad():
        cache = None
        for step in range(NEW_TOKENS):
            result = model(input_ids=ids, past_key_values=cache, use_cache=True)
            cache = result.past_key_values
            nxt = int(result.logits[0, -1].float().argmax()) if feed is None else feed[step]
            chosen.append(nxt)
            ids = torch.tensor([[nxt]])
    return Path(handle.run_dir), chosen


def compare(golden: Path, target: Path) -> CompareSession:
    return compare_dumps(golden, target)


@pytest.fixture(scope="module")
def golden(llama, tmp_path_factory):
    return dump(llama, tmp_path_factory.mktemp("golden"))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_benign_target_raises_no_failure(llama, golden, tmp_path: Path, dtype) -> None:
    golden_dir, ids = golden
    target_dir, _ = dump(copy.deepcopy(llama).to(dtype), tmp_path, feed=ids)
    session = compare(golden_dir, target_dir)
    results = session.results()
    assert len(results) > 300
    bad = [f"{r.key.label()}: {r.reason}" for r in results if r.verdict is not Verdict.PASS]
    assert bad == []
    assert session.first_failure is None and session.first_bad_token is None


@pytest.mark.slow
def test_fault_is_the_first_failure_at_its_operator(llama, golden, tmp_path: Path) -> None:
    golden_dir, ids = golden
    broken = copy.deepcopy(llama)
    weight = broken.get_submodule(FAULT_NODE.removeprefix("root.")).weight
    with torch.no_grad():
        noise = torch.randn(weight.shape, generator=torch.Generator().manual_seed(5))
        weight.add_(noise * float(weight.std()) * 0.05)
    target_dir, _ = dump(broken, tmp_path, feed=ids)
    session = compare(golden_dir, target_dir)
    first = session.first_failure
    assert first is not None
    assert (first.token, first.node, first.stem) == (0, FAULT_NODE, "output")
    assert first.verdict is Verdict.FAIL and "cosine_similarity" in first.failed_metrics
    assert session.root_cause is not None and session.root_cause.node == FAULT_NODE
