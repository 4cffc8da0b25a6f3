"""Per-case capture: many prompts in one dump, compared case by case."""

from __future__ import annotations

import copy
import json
import sys
import textwrap

import pytest
import torch
from layerwatch.capture import DumpConfig, case, register_hook
from layerwatch.capture.demo import build_model, generate, make_prompt
from live.helpers import index_records, layerwatch
from support import lwdump

transformers = pytest.importorskip("transformers")

LLAMA = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=97, max_position_embeddings=64,
    attn_implementation="eager",
)  # fmt: skip


def _hf_generate(model, seed, new):
    ids = torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
            do_sample=False, pad_token_id=0,
        )  # fmt: skip


def _demo_cases(out, fault, keys):
    model = build_model(fault=fault, layers=4)
    with register_hook(model, DumpConfig(dump_path=out)):
        for i, key in enumerate(keys):
            with case(key):
                generate(model, make_prompt(6, seed=10 + i), 6 if i == 1 else 3)


def test_each_generate_call_is_a_case_and_compare_reports_each(tmp_path):
    torch.manual_seed(0)
    golden = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).eval()
    target = copy.deepcopy(golden)
    with torch.no_grad():
        target.model.layers[1].mlp.down_proj.weight.mul_(1.5)
    for name, model in (("g", golden), ("t", target)):
        with register_hook(model, DumpConfig(dump_path=tmp_path / name)) as h:
            for seed, new in ((1, 3), (2, 4), (3, 2)):
                _hf_generate(model, seed, new)
        assert "generate" not in vars(model)  # the wrapper is gone with the hooks
    marks = [(r["k"], r["key"], r["token"]) for r in lwdump.index(h.run_dir) if "case" in r["k"]]
    assert marks == [
        ("case", "0", 0), ("case_end", "0", 3), ("case", "1", 3), ("case_end", "1", 7),
        ("case", "2", 7), ("case_end", "2", 9),
    ]  # fmt: skip
    proc = layerwatch("compare", str(tmp_path / "g"), str(tmp_path / "t"), "--json")
    report = json.loads(proc.stdout)
    assert proc.returncode == 1
    assert [c["key"] for c in report["cases"]] == ["0", "1", "2"]
    assert all(c["verdict"] == "fail" and c["first_bad_token"] == 0 for c in report["cases"])
    assert {r["token"] for r in report["rows"] if r["case"] == "1"} == {0, 1, 2, 3}
    assert report["summary"]["diverged"] == 0  # each case starts afresh


def test_cases_pair_by_key_else_by_order_and_only_the_faulty_one_fails(tmp_path):
    _demo_cases(tmp_path / "g", None, ["a", "b", "c"])
    _demo_cases(tmp_path / "t", "rotary_swap", ["x", "y", "z"])  # other keys: by order
    proc = layerwatch("compare", str(tmp_path / "g"), str(tmp_path / "t"), "--json")
    report = json.loads(proc.stdout)
    verdicts = {c["key"]: (c["verdict"], c["first_bad_token"]) for c in report["cases"]}
    assert verdicts == {"a": ("pass", None), "b": ("fail", 4), "c": ("pass", None)}
    assert report["first_failure"]["case"] == "b"
    assert report["first_failure"]["node"] == "root.layers.1.attention.rope"
    _demo_cases(tmp_path / "t2", None, ["c", "a"])  # by key, one golden case missing
    report = json.loads(
        layerwatch("compare", str(tmp_path / "g"), str(tmp_path / "t2"), "--json").stdout
    )
    verdicts = {c["key"]: c["verdict"] for c in report["cases"]}
    # paired by key: golden a and target a had other prompts, so they diverge from token 0
    assert verdicts == {"a": "diverged", "b": "unpaired", "c": "diverged"}


def test_duplicate_case_keys_are_one_line_and_exit_2(tmp_path):
    _demo_cases(tmp_path / "g", None, ["a", "a"])
    proc = layerwatch("compare", str(tmp_path / "g"), str(tmp_path / "g"))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "appears twice" in proc.stderr


def test_zero_code_capture_splits_generate_calls(tmp_path):
    script = tmp_path / "infer.py"
    script.write_text(
        textwrap.dedent(f"""
        import torch, transformers
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{LLAMA!r})).eval()
        for seed in (1, 2):
            ids = torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(seed))
            with torch.no_grad():
                model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3,
                               min_new_tokens=3, do_sample=False, pad_token_id=0)
    """)
    )
    proc = layerwatch("dump", "--out", str(tmp_path / "d"), "--", sys.executable, str(script))
    assert proc.returncode == 0, proc.stderr
    marks = [
        (r["k"], r["key"], r["token"]) for r in index_records(tmp_path / "d") if "case" in r["k"]
    ]
    assert marks == [("case", "0", 0), ("case", "1", 3), ("case_end", "1", 6)]


def test_only_the_listed_cases_are_captured(tmp_path):
    _demo_cases(tmp_path / "g", None, ["a", "b", "c"])
    bad = tmp_path / "bad.json"  # what `layerwatch badcase --json` prints
    bad.write_text(json.dumps({"summary": {}, "bad_cases": [{"key": "b", "first_diff_token": 4}]}))
    model = build_model(fault="rotary_swap", layers=4)
    with register_hook(model, DumpConfig(dump_path=tmp_path / "t", cases=bad)) as h:
        for i, key in enumerate(["a", "b", "c"]):
            with case(key):
                generate(model, make_prompt(6, seed=10 + i), 6 if i == 1 else 3)
    lines = lwdump.index(h.run_dir)
    assert {ln["token"] for ln in lines if ln["k"] == "t"} == set(range(3, 9))  # case b only
    assert [(ln["k"], ln["key"]) for ln in lines if "case" in ln["k"]] == [
        ("case", "b"), ("case_end", "b")
    ]  # fmt: skip
    report = json.loads(
        layerwatch("compare", str(tmp_path / "g"), str(tmp_path / "t"), "--json").stdout
    )
    verdicts = {c["key"]: (c["verdict"], c["first_bad_token"]) for c in report["cases"]}
    assert verdicts == {"a": ("unpaired", None), "b": ("fail", 4), "c": ("unpaired", None)}


def test_dump_cases_from_the_command_line(tmp_path):
    script = tmp_path / "infer.py"
    script.write_text(
        textwrap.dedent("""
        from layerwatch.capture import case
        from layerwatch.capture.demo import build_model, generate, make_prompt
        model = build_model(layers=2)
        for i, key in enumerate(["q1", "q2", "q3"]):
            with case(key):
                generate(model, make_prompt(4, seed=i), 2)
    """)
    )
    (tmp_path / "keys.json").write_text('["q3"]')
    out = tmp_path / "d"
    proc = layerwatch(
        "dump",
        "--out",
        str(out),
        "--cases",
        str(tmp_path / "keys.json"),
        "--",
        sys.executable,
        str(script),
    )
    assert proc.returncode == 0, proc.stderr
    recs = index_records(out)
    assert {r["token"] for r in recs if r["k"] == "t"} == {4, 5}
    (tmp_path / "broken.json").write_text('{"rows": 3}')
    proc = layerwatch(
        "dump",
        "--out",
        str(out),
        "--cases",
        str(tmp_path / "broken.json"),
        "--",
        sys.executable,
        str(script),
    )
    assert proc.returncode == 2 and "no case list" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0


def test_headless_open_of_per_case_dumps_prints_compares_summary_and_exit(tmp_path):
    _demo_cases(tmp_path / "g", None, ["a", "b"])
    _demo_cases(tmp_path / "t", "rotary_swap", ["a", "b"])
    g, t = str(tmp_path / "g"), str(tmp_path / "t")
    compared = layerwatch("compare", g, t)
    opened = layerwatch("open", g, t, "--headless")
    assert opened.returncode == compared.returncode == 1
    assert opened.stdout == compared.stdout
    assert "case b: fail" in opened.stdout and "case a: pass" in opened.stdout


def test_whether_dumps_have_cases_is_found_without_opening_the_index(tmp_path, monkeypatch):
    """``open`` asks before its live session reads the index: the case lines are found by the
    index's bytes (a mark cut by a read block too), no column table is built for it."""
    from layerwatch.engine.cases import dumps_have_cases
    from layerwatch.engine.readers import layerwatch as lw
    from layerwatch.engine.readers import open_dump

    _demo_cases(tmp_path / "c", None, ["a", "b"])
    model = build_model(layers=2)
    with register_hook(model, DumpConfig(dump_path=tmp_path / "p")):
        generate(model, make_prompt(6, seed=1), 3)

    def no_columns(self):
        raise AssertionError("opened the index's columns")

    monkeypatch.setattr(lw.LayerwatchReader, "open_columns", no_columns)
    c, p = str(tmp_path / "c"), str(tmp_path / "p")
    assert dumps_have_cases(c, c) and dumps_have_cases(p, c) and not dumps_have_cases(p, p)
    index = next((tmp_path / "c").rglob("index.jsonl")).read_bytes()
    cut = index.index(b'"k":"case') + 4
    real_read = open  # every 8 MB block cut just inside the first case mark

    class Cut:
        def __init__(self, fh):
            self.fh, self.first = fh, True

        def read(self, n):
            n, self.first = (cut if self.first else n), False
            return self.fh.read(n)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

    monkeypatch.setattr(
        lw, "open", lambda path, mode="r", **kw: Cut(real_read(path, mode, **kw)), raising=False
    )
    assert open_dump(c).has_case_lines()
