"""Thresholds: packaged defaults, user overlay, unknown keys, dtype classes, per-glob overrides."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.numerics.thresholds import Thresholds, dtype_class, fmt_value, looser
from layerwatch.engine.records import COSINE, KL, MAX_REL, RED, STAT_METRICS, Verdict

GOOD = {COSINE: 1.0, RED: 0.0, "nonfinite_mismatch": 0.0, MAX_REL: 1e9}


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "user.toml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("name", "klass"),
    [
        ("float32", "fp32"),
        ("torch.float32", "fp32"),
        ("float64", "fp32"),
        ("float16", "fp16"),
        ("torch.float16", "fp16"),
        ("half", "fp16"),
        ("bfloat16", "bf16"),
        ("torch.bfloat16", "bf16"),
        ("bf16", "bf16"),
        ("int64", "int"),
        ("torch.int32", "int"),
        ("bool", "int"),
        ("uint8", "int"),
        ("float8_e4m3fn", "bf16"),
    ],
)
def test_dtype_classes(name: str, klass: str) -> None:
    assert dtype_class(name) == klass


def test_the_looser_dtype_applies() -> None:
    assert looser("float32", "bfloat16") == "bf16"
    assert looser("bfloat16", "float32") == "bf16"
    assert looser("float16", "bfloat16") == "bf16"
    assert looser("int64", "float32") == "fp32"
    th = Thresholds.load()
    m = {COSINE: 1 - 5e-5, RED: 0.0}
    assert (
        th.judge(m, node="root.a", golden_dtype="float32", target_dtype="float32")[0]
        is Verdict.FAIL
    )
    assert (
        th.judge(m, node="root.a", golden_dtype="float32", target_dtype="bfloat16")[0]
        is Verdict.PASS
    )


def test_max_relative_error_is_informational() -> None:
    th = Thresholds.load()
    assert (
        th.judge(GOOD, node="root.a", golden_dtype="float32", target_dtype="float32")[0]
        is Verdict.PASS
    )
    checks = {
        c.name: c
        for c in th.checks(GOOD, node="root.a", golden_dtype="float32", target_dtype="float32")
    }
    assert checks[MAX_REL].limit is None and checks[MAX_REL].passed
    assert checks[COSINE].op == ">=" and checks[RED].op == "<="
    assert checks[COSINE].limit is not None


def test_user_file_overlays_the_defaults(tmp_path: Path) -> None:
    defaults = Thresholds.load()
    th = Thresholds.load(write(tmp_path, "[limits.fp32]\ncosine_similarity = 0.5\n"))
    assert th.limits["fp32"][COSINE] == 0.5
    assert th.limits["fp32"][RED] == defaults.limits["fp32"][RED]  # untouched keys kept
    assert th.limits["bf16"] == defaults.limits["bf16"]
    assert th.source.endswith("user.toml")


def test_false_makes_a_gate_informational(tmp_path: Path) -> None:
    th = Thresholds.load(write(tmp_path, "[limits.fp32]\nrelative_euclidean_distance = false\n"))
    m = dict(GOOD, **{RED: 5.0})
    assert (
        th.judge(m, node="root.a", golden_dtype="float32", target_dtype="float32")[0]
        is Verdict.PASS
    )


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[limits.fp32]\ncosine = 0.9\n", "limits.fp32.cosine"),
        ("[limits.fp8]\ncosine_similarity = 0.9\n", "limits.fp8"),
        ("[limtis.fp32]\ncosine_similarity = 0.9\n", "limtis"),
        ("[[override]]\nnode = 'root.x'\ncosin = 0.9\n", "override[0].cosin"),
        ("[[override]]\ncosine_similarity = 0.9\n", "override[0].node"),
        ("[limits.fp32]\ncosine_similarity = 'high'\n", "limits.fp32.cosine_similarity"),
        ("[statistics.bf16]\nkl_divergence = 1\n", "statistics.bf16.kl_divergence"),
        ("[floor]\nfp32 = -1\n", "floor.fp32"),
    ],
)
def test_unknown_or_bad_keys_name_the_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(LayerwatchError, match=key.replace("[", r"\[").replace("]", r"\]")) as info:
        Thresholds.load(write(tmp_path, text))
    assert "\n" not in str(info.value)


def test_unreadable_and_invalid_files_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(LayerwatchError, match="cannot read thresholds file"):
        Thresholds.load(str(tmp_path / "missing.toml"))
    with pytest.raises(LayerwatchError, match="not valid TOML"):
        Thresholds.load(write(tmp_path, "[limits\n"))


def test_per_node_glob_overrides(tmp_path: Path) -> None:
    th = Thresholds.load(
        write(
            tmp_path,
            """
[[override]]
node = "root.model.layers.*.mlp*"
cosine_similarity = 0.9

[[override]]
node = "root.model.layers.3.mlp.down_proj"
dtype = "bf16"
cosine_similarity = 0.999999
""",
        )
    )
    m = {COSINE: 0.95, RED: 0.0}

    def verdict(node: str, target: str = "float32") -> tuple[Verdict, tuple[str, ...], str]:
        return th.judge(m, node=node, golden_dtype="float32", target_dtype=target)

    assert verdict("root.model.layers.0.self_attn")[0] is Verdict.FAIL
    assert verdict("root.model.layers.2.mlp.up_proj")[0] is Verdict.PASS
    # The later, dtype-specific override wins for bf16 only.
    assert verdict("root.model.layers.3.mlp.down_proj")[0] is Verdict.PASS
    v, failed, reason = verdict("root.model.layers.3.mlp.down_proj", "bfloat16")
    assert v is Verdict.FAIL and failed == (COSINE,)
    assert (
        reason
        == "cosine 0.95 < 0.999999 (bfloat16 limits, override root.model.layers.3.mlp.down_proj)"
    )


def test_override_by_tensor_stem_and_logits(tmp_path: Path) -> None:
    th = Thresholds.load(
        write(
            tmp_path,
            """
[[override]]
node = "root.lm_head*"
logits = true
kl_divergence = 0.5
[[override]]
node = "*"
tensor = "input*"
relative_euclidean_distance = false
""",
        )
    )
    m = {COSINE: 1.0, RED: 0.1, KL: 0.1}
    kw = {"node": "root.lm_head", "golden_dtype": "float32", "target_dtype": "float32"}
    assert th.judge(m, **kw, is_logits=True, stem="output")[1] == (RED,)
    assert th.judge(m, **kw, is_logits=True, stem="input_0")[0] is Verdict.PASS


def test_logits_section_applies_only_to_logits() -> None:
    th = Thresholds.load()
    m = {COSINE: 1.0, RED: 0.0, KL: 1.0}
    kw = {"node": "root.lm_head", "golden_dtype": "float32", "target_dtype": "bfloat16"}
    assert th.judge(m, **kw)[0] is Verdict.PASS
    verdict, failed, reason = th.judge(m, **kw, is_logits=True)
    assert verdict is Verdict.FAIL and failed == (KL,)
    assert reason.endswith("(bfloat16 logits limits)")


def test_statistics_section_judges_statistics_metrics() -> None:
    th = Thresholds.load()
    stats = dict.fromkeys(STAT_METRICS, 0.0) | {"nonfinite_mismatch": 0.0}
    kw = {"node": "root.a", "golden_dtype": "float32", "target_dtype": "float32"}
    assert th.judge(stats, **kw)[0] is Verdict.PASS
    verdict, failed, reason = th.judge(stats | {"l2norm_stat_relative_error": 0.5}, **kw)
    assert verdict is Verdict.FAIL and failed == ("l2norm_stat_relative_error",)
    assert reason.endswith("(float32 statistics limits)")
    assert th.judge(stats | {"mean_stat_relative_error": 0.5}, **kw)[0] is Verdict.PASS


def test_thresholds_pickle_for_worker_processes() -> None:
    th = Thresholds.load()
    again = pickle.loads(pickle.dumps(th))
    assert again.limits == th.limits and again.overrides == th.overrides


def test_value_formatting_keeps_the_digits_that_matter() -> None:
    assert fmt_value(COSINE, 0.99871) == "0.99871"
    assert fmt_value(COSINE, 0.9999943) == "0.9999943"
    assert fmt_value(COSINE, 0.9871) == "0.9871"
    assert fmt_value(RED, 0.16) == "0.16"
    assert fmt_value(RED, float("inf")) == "inf"
    assert fmt_value("nonfinite_mismatch", 3.0) == "3"


def test_parsed_defaults_kept_for_later_processes_equal_a_fresh_parse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """engine/numerics/thresholds.py keeps the parsed packaged TOML (marshal) in the cache dir;
    a later process loads it instead of parsing. Equal to the parse; corrupt or unwritable
    caches only mean parsing again."""
    import tomllib
    from layerwatch.engine.numerics import thresholds as th

    monkeypatch.setenv("LAYERWATCH_CACHE_DIR", str(tmp_path / "cache"))
    text = (Path(th.__file__).parent.parent / "thresholds.toml").read_text(encoding="utf-8")
    fresh = tomllib.loads(text)
    assert th._remembered(text) is None  # nothing kept yet
    th._remember(text, fresh)
    assert th._remembered(text) == fresh
    assert th._remembered(text + "\n# edited") is None  # another text: another file
    th._parsed_path(text).write_bytes(b"\x00garbage")
    assert th._remembered(text) is None
    monkeypatch.setenv("LAYERWATCH_CACHE_DIR", "/proc/no-such-dir")
    th._remember(text, fresh)  # cannot write: no error
    assert th._remembered(text) is None
