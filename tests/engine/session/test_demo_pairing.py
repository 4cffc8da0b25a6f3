"""Pairing by weights on real captures: Hugging Face ``LlamaForCausalLM`` (golden) against the demo
model (Meta-Llama names and classes, same weights), both dumped by ``register_hook``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from layerwatch.engine.readers import open_dump
from layerwatch.engine.records import Verdict
from layerwatch.engine.session.blocks import layout_for
from layerwatch.engine.session.core import CompareSession

NEW_TOKENS = 3


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from layerwatch.capture import DumpConfig, register_hook
    from layerwatch.capture.demo import build_model, generate, make_prompt
    from layerwatch.capture.demo.hf import hf_generate, to_hf

    base = tmp_path_factory.mktemp("demo-hf")
    prompt = make_prompt()
    hf = to_hf(build_model())
    with register_hook(hf, DumpConfig(dump_path=base / "hf")):
        hf_ids = hf_generate(hf, prompt, NEW_TOKENS)
    for name, fault in (("clean", None), ("noisy", "noisy_weight")):
        model = build_model(fault=fault)
        with register_hook(model, DumpConfig(dump_path=base / name)):
            ids = generate(model, prompt, NEW_TOKENS)
        assert ids.tolist() == hf_ids.tolist()  # the fault does not change the tokens
    return base


def session_for(base: Path, target: str, auto_map: bool | None) -> CompareSession:
    session = CompareSession(auto_map=auto_map)
    for side, name in (("golden", "hf"), ("target", target)):
        session.add_update(side, open_dump(base / name).poll(None))
        session.finish(side)
    session.flush()
    return session


@pytest.mark.slow
@pytest.mark.parametrize("auto_map", [True, None])  # --auto-map, and the automatic fallback
def test_hf_vs_demo_pairs_by_weights_and_finds_the_fault(
    dumps: Path, auto_map: bool | None
) -> None:
    session = session_for(dumps, "noisy", auto_map)
    cause = session.root_cause
    assert cause is not None and (cause.token, cause.node) == (
        0,
        "root.model.layers.2.mlp.down_proj",
    )
    assert session.first_failure is not None and session.first_failure.node == cause.node
    results = session.results()
    pairs = {
        (r.key.node, r.target.key.node)
        for r in results
        if r.target is not None and r.golden is not None
    }
    # names and classes differ; the weights paired them
    assert ("root.model.layers.2.mlp.down_proj", "root.layers.2.feed_forward.w2") in pairs
    assert ("root.model.layers.0.post_attention_layernorm", "root.layers.0.ffn_norm") in pairs
    assert ("root.model.embed_tokens", "root.tok_embeddings") in pairs
    assert (
        "root.model.layers.5.mlp.act_fn",
        "root.layers.5.feed_forward.act",
    ) in pairs  # weightless, by position
    assert (
        "root.model.layers.1.self_attn",
        "root.layers.1.attention",
    ) in pairs  # HF tuple output_0 vs output
    assert session.summary.error == 0
    # HF's generate keeps only the last position of the logits: compared there, as logits
    lm = [r for r in results if r.key.node == "root.lm_head" and r.key.stem == "output"]
    assert len(lm) == NEW_TOKENS and all(r.is_logits and r.verdict is not Verdict.ERROR for r in lm)
    assert lm[0].golden.shape == lm[0].target.shape == (1, 1, 256)  # type: ignore[union-attr]
    assert "top1_agreement" in lm[0].metrics
    assert any("kept only the last position" in n for n in session.notes)
    # what has no counterpart is reported, with its side, and listed in the notes
    unpaired = {
        (r.key.node, r.golden is not None) for r in results if r.verdict is Verdict.UNPAIRED
    }
    assert ("root.model.rotary_emb", True) in unpaired
    assert ("root.layers.3.attention.cache", False) in unpaired
    assert any("golden modules unpaired: root.model.rotary_emb" in n for n in session.notes)


@pytest.mark.slow
def test_hf_vs_clean_demo_passes(dumps: Path) -> None:
    session = session_for(dumps, "clean", None)
    s = session.summary
    assert s.failed == 0 and s.error == 0 and s.pairs > 150 * NEW_TOKENS
    assert session.first_failure is None


@pytest.mark.slow
def test_cli_auto_map(dumps: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "layerwatch.tui",
            "compare",
            str(dumps / "hf"),
            str(dumps / "noisy"),
            "--auto-map",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    assert report["root_cause"]["node"] == "root.model.layers.2.mlp.down_proj"


@pytest.mark.slow
def test_demo_model_blocks(dumps: Path) -> None:
    demo = open_dump(dumps / "clean").poll(None).topology
    assert demo is not None
    layout = layout_for(demo)
    assert [b.label for b in layout.blocks] == [
        "embed",
        *[f"L{i}" for i in range(6)],
        "norm",
        "output",
    ]
    assert layout.block_of("root.layers.3.attention.cache") == 4
    hf = open_dump(dumps / "hf").poll(None).topology
    assert hf is not None
    assert [b.label for b in layout_for(hf).blocks] == [
        "embed",
        "rotary",
        *[f"L{i}" for i in range(6)],
        "norm",
        "lm_head",
    ]
