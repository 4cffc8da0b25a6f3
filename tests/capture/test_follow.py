"""Teacher forcing in process (``DumpConfig(follow=...)``) on a real Hugging Face Llama."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from layerwatch.capture import DumpConfig, register_hook
from layerwatch.capture.errors import LayerwatchError
from live.helpers import layerwatch
from support import lwdump

transformers = pytest.importorskip("transformers")

NEW = 8
VOCAB = 97


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(1234)
    cfg = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
        attn_implementation="eager",
    )  # fmt: skip
    golden = transformers.LlamaForCausalLM(cfg).eval()
    target = copy.deepcopy(golden)
    with torch.no_grad():  # a confident fault: flips tokens, and every later step would differ
        target.model.layers[1].mlp.down_proj.weight.mul_(4.0)
    return golden, target


PROMPT = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(3))


def _generate(model, ids=PROMPT, new=NEW, sample=False):
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
            do_sample=sample, pad_token_id=0, **({"top_k": 0} if sample else {}),
        )  # fmt: skip
    return out[0, ids.shape[1] :].tolist()


@pytest.fixture(scope="module")
def golden_dump(models, tmp_path_factory):
    out = tmp_path_factory.mktemp("golden")
    with register_hook(models[0], DumpConfig(dump_path=out)):
        tokens = _generate(models[0])
    return out, tokens


def _follow_lines(run_dir):
    return [ln for ln in lwdump.index(run_dir) if ln["k"] == "follow"]


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampling"])
def test_generate_is_fed_the_golden_tokens(models, golden_dump, tmp_path, sample):
    golden_out, golden_tokens = golden_dump
    assert _generate(models[1]) != golden_tokens  # without forcing the fault changes the text
    torch.manual_seed(7)
    with register_hook(models[1], DumpConfig(dump_path=tmp_path, follow=golden_out)) as h:
        tokens = _generate(models[1], sample=sample)
    # the golden's last choice never became an input id, so the last token is the target's own
    assert tokens[:-1] == golden_tokens[:-1]
    lines = _follow_lines(h.run_dir)
    assert [ln["token"] for ln in lines] == list(range(NEW - 1))  # the last step is not forced
    assert [ln["fed_id"] for ln in lines] == [[t] for t in golden_tokens[:-1]]
    flips = [ln for ln in lines if ln["own_id"] != ln["fed_id"]]
    assert flips, "the fault should make the target choose another token somewhere"
    # the dumped logits are the target's own: their argmax is the recorded own choice
    logits = {
        ln["token"]: ln
        for ln in lwdump.index(h.run_dir)
        if ln["k"] == "t" and ln["node"] == "root.lm_head" and ln["stem"] == "output"
    }
    for ln in lines:
        own = lwdump.load(h.run_dir, logits[ln["token"]])[0, -1].argmax().item()
        assert [own] == ln["own_id"]


def test_compare_after_follow_blames_the_fault_and_nothing_diverges(models, golden_dump, tmp_path):
    golden_out, _ = golden_dump
    unforced = tmp_path / "unforced"
    with register_hook(models[1], DumpConfig(dump_path=unforced)):
        _generate(models[1])
    forced = tmp_path / "forced"
    with register_hook(models[1], DumpConfig(dump_path=forced, follow=golden_out)):
        _generate(models[1])
    before = json.loads(layerwatch("compare", str(golden_out), str(unforced), "--json").stdout)
    proc = layerwatch("compare", str(golden_out), str(forced), "--json")
    after = json.loads(proc.stdout)
    assert before["summary"]["diverged"] > 0
    assert after["summary"]["diverged"] == 0
    assert after["first_failure"]["node"].startswith("root.model.layers.1.mlp")
    assert {r["token"] for r in after["rows"] if r["verdict"] != "diverged"} == set(range(NEW))


def test_a_different_prompt_stops_the_run_with_one_line(models, golden_dump, tmp_path):
    golden_out, _ = golden_dump
    other = torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(9))
    with (
        register_hook(models[1], DumpConfig(dump_path=tmp_path, follow=golden_out)) as h,
        pytest.raises(LayerwatchError, match=r"follow: token 0: the prompt differs"),
    ):
        _generate(models[1], ids=other)
    h.close()
    assert any(ln["k"] == "error" for ln in lwdump.index(h.run_dir))


def test_more_steps_than_the_golden_has_is_one_line(models, golden_dump, tmp_path, capfd):
    golden_out, golden_tokens = golden_dump
    with register_hook(models[1], DumpConfig(dump_path=tmp_path, follow=golden_out)):
        tokens = _generate(models[1], new=NEW + 3)
    assert tokens[: NEW - 1] == golden_tokens[: NEW - 1]
    err = capfd.readouterr().err.strip().splitlines()
    assert [ln for ln in err if "follow" in ln] == [
        f"layerwatch: follow: the program ran more steps than the golden dump has tokens "
        f"({NEW}); from token {NEW} on the target picks its own tokens"
    ]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing", "does not exist"),
        (lambda p: p, "not a layerwatch dump"),
        (lambda p: _index(p, ""), "has no token lines"),
        (lambda p: _index(p, '{"k":"token","token":1,"input_ids":[1]}\n'), "no token line for token 0"),
        (lambda p: _index(p, '{"k":"token","token":0,"input_ids":null}\n'), "without input ids"),
    ],
    ids=["missing", "not-a-dump", "no-tokens", "gap", "no-ids"],
)  # fmt: skip
def test_an_unusable_golden_dump_is_refused_before_anything_runs(tmp_path, make, message):
    with pytest.raises(LayerwatchError, match=message):
        DumpConfig(dump_path=tmp_path / "out", follow=make(tmp_path))


def _index(path, text):
    rank = path / "cpu_1"
    rank.mkdir()
    (rank / "index.jsonl").write_text(text)
    return path


def test_a_batch_of_prompts_is_followed_row_by_row(models, tmp_path):
    ids = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(5))

    def rows(model):
        with torch.no_grad():
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, min_new_tokens=5,
                do_sample=False, pad_token_id=0,
            )  # fmt: skip
        return [r[:-1] for r in out[:, 5:].tolist()]  # the last token is never forced

    with register_hook(models[0], DumpConfig(dump_path=tmp_path / "g")):
        golden = rows(models[0])
    assert rows(models[1]) != golden
    with register_hook(models[1], DumpConfig(dump_path=tmp_path / "t", follow=tmp_path / "g")) as h:
        assert rows(models[1]) == golden
    assert all(len(ln["fed_id"]) == 2 for ln in _follow_lines(h.run_dir))
