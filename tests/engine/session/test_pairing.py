"""Pairing golden ↔ target: by name, by regex rules, by msit's op mapping, by identical weights."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.records import TensorKey, Verdict
from layerwatch.engine.session.core import CompareSession
from layerwatch.engine.session.pairing import MsitOpMapping, NameRules, load_mapping
from layerwatch.engine.session.weightmap import match_by_weights
from support.sessions import finished_session
from support.toy_model import META_TYPES, ToyModel, ToyRun, meta_names, renamed, write_tensor

RULES_TOML = r"""
# Meta-Llama names (target) -> the golden's Hugging Face names
[[node]]
pattern = '^root\.layers'
replace = 'root.model.layers'
[[node]]
pattern = '\.attention_norm$'
replace = '.input_layernorm'
[[node]]
pattern = '\.attention(\.|$)'
replace = '.self_attn\1'
[[node]]
pattern = '\.self_attn\.wq$'
replace = '.self_attn.q_proj'
[[node]]
pattern = '\.self_attn\.wo$'
replace = '.self_attn.o_proj'
[[node]]
pattern = '\.feed_forward\.w1$'
replace = '.mlp.up_proj'
[[node]]
pattern = '\.feed_forward\.w2$'
replace = '.mlp.down_proj'
[[node]]
pattern = '\.feed_forward\.act$'
replace = '.mlp.act_fn'
[[node]]
pattern = '\.feed_forward$'
replace = '.mlp'
[[node]]
pattern = '^root\.(tok_embeddings|norm|output|model_impl)$'
replace = 'root.X\1'
[[node]]
pattern = '^root\.Xtok_embeddings$'
replace = 'root.model.embed_tokens'
[[node]]
pattern = '^root\.Xnorm$'
replace = 'root.model.norm'
[[node]]
pattern = '^root\.Xoutput$'
replace = 'root.lm_head'
[[node]]
pattern = '^root\.Xmodel_impl$'
replace = 'root.model'

[[stem]]
pattern = '^output_attn$'
replace = 'output'
node = 'attention$'
"""


@pytest.fixture(scope="module")
def pair_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ToyRun]:
    base = tmp_path_factory.mktemp("pairing")
    model = ToyModel(layers=2, hidden=16, vocab=31, seed=5)
    golden = model.run(base / "g")
    forced = {t: golden.token_ids[t][0] for t in range(1, 4)}
    meta = renamed(model.run(base / "m", dtype="bfloat16", feed=forced), meta_names(2), META_TYPES)
    # the Meta attention's file stem is ``output_attn`` (a stem rule maps it back)
    for i, r in enumerate(meta.records):
        if r.key.node.endswith(".attention") and r.key.stem == "output":
            meta.records[i] = replace(r, key=r.key._replace(stem="output_attn"))
    return {"golden": golden, "meta": meta, "model": model}  # type: ignore[dict-item]


def run_session(golden: ToyRun, target: ToyRun, **kwargs: object) -> CompareSession:
    return finished_session(golden.update(), target.update(), **kwargs)


def test_names_alone_pair_almost_nothing(pair_runs: dict[str, ToyRun]) -> None:
    session = run_session(pair_runs["golden"], pair_runs["meta"], auto_map=False)
    assert session.summary.pairs <= 8  # only the root's tensors share a name
    unpaired = [r for r in session.results() if r.verdict is Verdict.UNPAIRED]
    assert {r.golden is not None for r in unpaired} == {True, False}  # both sides reported


@pytest.mark.parametrize("fmt", ["toml", "json"])
def test_rules_file_pairs_renamed_modules(
    tmp_path: Path, pair_runs: dict[str, ToyRun], fmt: str
) -> None:
    if fmt == "toml":
        path = tmp_path / "rules.toml"
        path.write_text(RULES_TOML)
    else:
        import tomllib

        data = tomllib.loads(RULES_TOML)
        data["node"] = [[r["pattern"], r["replace"]] for r in data["node"]]  # list form
        path = tmp_path / "rules.json"
        path.write_text(json.dumps(data))
    rules = load_mapping(path)
    assert isinstance(rules, NameRules)
    assert rules.map_node("root.layers.1.attention.wq") == "root.model.layers.1.self_attn.q_proj"
    session = run_session(pair_runs["golden"], pair_runs["meta"], mapping=str(path), auto_map=False)
    s = session.summary
    assert s.unpaired == 0 and s.pairs == len(pair_runs["golden"].records)
    assert s.failed == 0 and s.error == 0  # bf16 target, same weights: within bf16 limits
    attn = [
        r
        for r in session.results()
        if r.key.node.endswith("0.self_attn") and r.key.stem == "output"
    ]
    assert attn and attn[0].target is not None and attn[0].target.key.stem == "output_attn"


@pytest.mark.parametrize(
    ("text", "suffix", "message"),
    [
        ("[[node]]\npattern = '('\nreplace = 'x'\n", ".toml", "node rule 1"),
        ("[[node]]\npattern = 'a'\n", ".toml", "needs 'pattern' and 'replace'"),
        ("[[node]\n", ".toml", "not valid TOML"),
        ('{"node": [["(a)", "\\\\2"]]}', ".json", "node rule 1"),
        ("{not json", ".json", "not valid JSON"),
        ('{"Linear Op": ["x"]}', ".json", "neither a rules file nor msit's op mapping"),
    ],
)
def test_bad_mapping_files_are_one_line_errors(
    tmp_path: Path, text: str, suffix: str, message: str
) -> None:
    path = tmp_path / f"map{suffix}"
    path.write_text(text)
    with pytest.raises(LayerwatchError, match=message.replace("(", r"\(")) as info:
        load_mapping(path)
    assert "\n" not in str(info.value)


def test_missing_mapping_file(tmp_path: Path) -> None:
    with pytest.raises(LayerwatchError, match="cannot read mapping file"):
        load_mapping(tmp_path / "nope.toml")


def atb_names(layers: int) -> dict[str, str]:
    """Toy names → ATB-style op directories (``root.{i}_{OpType}``), as the ATB reader names them."""
    out = {
        "root.model.embed_tokens": "root.0_WordEmbedding",
        "root.model.norm": "root.9_RmsNormOperation",
        "root.lm_head": "root.10_LmHead",
        "root.model.layers": "root.layers_",
        "root.model": "root.model_",
    }
    for i in range(layers):
        g, t = f"root.model.layers.{i}", f"root.{i + 1}_Decoder"
        out.update(
            {
                g: t,
                f"{g}.input_layernorm": f"{t}.0_RmsNormOperation",
                f"{g}.self_attn": f"{t}.1_Attention",
                f"{g}.self_attn.q_proj": f"{t}.1_Attention.0_LinearOperation",
                f"{g}.self_attn.o_proj": f"{t}.1_Attention.1_LinearOperation",
                f"{g}.mlp": f"{t}.2_Mlp",
                f"{g}.mlp.up_proj": f"{t}.2_Mlp.0_LinearOperation",
                f"{g}.mlp.act_fn": f"{t}.2_Mlp.1_ActivationOperation",
                f"{g}.mlp.down_proj": f"{t}.2_Mlp.2_LinearOperation",
            }
        )
    return out


def test_msit_op_mapping_file_pairs_by_type_within_layers(
    tmp_path: Path, pair_runs: dict[str, ToyRun]
) -> None:
    types = {
        "ToyDecoderLayer": "DecoderLayer",
        "RMSNorm": "RmsNormOperation",
        "Linear": "LinearOperation",
        "SiLU": "ActivationOperation",
        "ToyAttention": "AttentionLayer",
        "ToyMLP": "MlpGateLayerV2",
    }
    golden = pair_runs["golden"]
    target = renamed(
        pair_runs["model"].run(
            tmp_path / "atb", feed={t: golden.token_ids[t][0] for t in range(1, 4)}
        ),
        atb_names(2),
        types,
    )  # type: ignore[attr-defined]
    # ATB names outputs outtensor{i} -> output_{i}
    target.records = [
        replace(r, key=r.key._replace(stem="output_0")) if r.key.stem == "output" else r
        for r in target.records
    ]
    (tmp_path / "map").mkdir()
    (tmp_path / "map" / "op_mapping_file.json").write_text(
        json.dumps(
            {
                "LinearOperation_outtensor0": ["Linear_output_0"],
                "RmsNormOperation": ["RMSNorm"],
                "ActivationOperation": "SiLU",  # a plain string: msit iterates it per character; we take it whole
                "AttentionLayer": ["ToyAttention"],
                "MlpGateLayerV2": ["ToyMLP"],
                "DecoderLayer": ["ToyDecoderLayer"],
            }
        )
    )
    mapping = load_mapping(tmp_path / "map")  # msit's -mf takes the directory
    assert isinstance(mapping, MsitOpMapping)
    session = run_session(golden, target, mapping=mapping)
    results = session.results()
    in_layers = [r for r in results if ".layers." in r.key.node]
    assert in_layers and all(r.verdict is Verdict.PASS for r in in_layers)
    q = next(
        r
        for r in in_layers
        if r.key.node == "root.model.layers.1.self_attn.q_proj" and r.key.stem == "output"
    )
    assert q.target is not None and q.target.key == TensorKey(
        q.key.token, "root.2_Decoder.1_Attention.0_LinearOperation", "output_0"
    )
    # outside the layers msit's mapping says nothing: reported as unpaired on both sides, not dropped
    outside = {r.key.node for r in results if r.verdict is Verdict.UNPAIRED}
    assert {
        "root.model.embed_tokens",
        "root.0_WordEmbedding",
        "root.lm_head",
        "root.10_LmHead",
    } <= outside


def test_weights_pair_another_implementation(pair_runs: dict[str, ToyRun]) -> None:
    golden, meta = pair_runs["golden"], pair_runs["meta"]
    found = match_by_weights(golden.topology, meta.topology)
    rename = meta_names(2)
    assert found.pairs == {rename.get(g, g): g for g in golden.topology.nodes}
    # explicit --auto-map and the automatic fallback give the same pairs
    for auto in (True, None):
        session = run_session(golden, meta, auto_map=auto)
        s = session.summary
        assert s.unpaired == 0 and s.failed == 0 and s.error == 0, (auto, s, session.notes)
        assert any(n.startswith("auto-map:") for n in session.notes)


def test_weights_from_dumped_parameters_without_fingerprints(
    tmp_path: Path, pair_runs: dict[str, ToyRun]
) -> None:
    """msit-style dumps: no fingerprints in the topology, but the full weights are on disk."""
    golden, meta, model = pair_runs["golden"], pair_runs["meta"], pair_runs["model"]
    rename = meta_names(2)
    weights_g, weights_t = {}, {}
    for full, array in model.params.items():  # type: ignore[attr-defined]
        node, local = full.rsplit(".", 1)
        weights_g[full] = write_tensor(tmp_path / "wg" / full, array, "float32")
        weights_t[f"{rename.get(node, node)}.{local}"] = write_tensor(
            tmp_path / "wt" / full, array, "bfloat16"
        )
    bare_g, bare_t = renamed(golden, {}), renamed(meta, {})
    for topo in (bare_g.topology, bare_t.topology):
        for node in topo.nodes.values():
            node.params = {}
    found = match_by_weights(bare_g.topology, bare_t.topology, weights_g, weights_t)
    assert found.pairs == {rename.get(g, g): g for g in golden.topology.nodes}
    # a weight that differs after the cast is not paired, even though its fingerprint was taken from it
    weights_t["root.layers.0.attention.wq.weight"] = weights_t["root.layers.1.attention.wq.weight"]
    found = match_by_weights(bare_g.topology, bare_t.topology, weights_g, weights_t)
    assert found.pairs.get("root.layers.0.attention.wq") != "root.model.layers.0.self_attn.q_proj"


def test_weightless_leftovers_are_named_in_the_notes(pair_runs: dict[str, ToyRun]) -> None:
    golden, meta = pair_runs["golden"], pair_runs["meta"]
    topo = renamed(meta, {}).topology
    # a lone weightless leaf pairs whatever its class; two of another class beside one do not
    topo.nodes["root.layers.1.feed_forward.act"].type = "GELU"
    topo.nodes["root.layers.0.feed_forward.act"].type = "GELU"
    topo.add("root.layers.0.feed_forward.dropout", "Dropout", "root.layers.0.feed_forward", 99)
    found = match_by_weights(golden.topology, topo)
    assert found.pairs["root.layers.1.feed_forward.act"] == "root.model.layers.1.mlp.act_fn"
    assert "root.layers.0.feed_forward.act" not in found.pairs
    assert any("root.model.layers.0.mlp.act_fn" in n for n in found.notes)
    assert any("root.layers.0.feed_forward.dropout" in n for n in found.notes)
