"""``layerwatch compare`` on msit logitscmp folders (``*_{key}_{token}.pth``), real model logits."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from live.helpers import layerwatch

transformers = pytest.importorskip("transformers")

VOCAB = 97
PROMPT = 6
NEW = 6
FAULT_FROM = 3


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Golden fp32 logits of two cases; target: case 7 in bf16 (benign), case 8 with a fault
    from token 3 on. The target reads the golden's sequence (teacher-forced), as logitsdump
    after ``--follow`` would."""
    torch.manual_seed(1234)
    cfg = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
        attn_implementation="eager",
    )  # fmt: skip
    golden = transformers.LlamaForCausalLM(cfg).eval()
    bf16 = copy.deepcopy(golden).to(torch.bfloat16)
    faulty = copy.deepcopy(golden)
    with torch.no_grad():
        faulty.model.layers[1].mlp.down_proj.weight.mul_(4.0)
    root = tmp_path_factory.mktemp("logits")
    g_dir, t_dir = root / "golden", root / "target"
    g_dir.mkdir()
    t_dir.mkdir()
    for key, seed in ((7, 1), (8, 2)):
        ids = torch.randint(0, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            seq = golden.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW,
                min_new_tokens=NEW, do_sample=False, pad_token_id=0,
            )  # fmt: skip
            g_logits = golden(seq).logits[0, PROMPT - 1 : PROMPT - 1 + NEW]
            if key == 7:
                t_logits = bf16(seq).logits[0, PROMPT - 1 : PROMPT - 1 + NEW]
            else:
                bad = faulty(seq).logits[0, PROMPT - 1 : PROMPT - 1 + NEW]
                t_logits = torch.cat([g_logits[:FAULT_FROM], bad[FAULT_FROM:]])
        for k in range(NEW):
            g, t = g_logits[k].clone(), t_logits[k].clone()
            if key == 8:  # msit's other shape on the golden side: [1, 1, V]
                g = g.view(1, 1, -1)
            torch.save(g, g_dir / f"logits_{key}_{k}.pth")
            torch.save(t, t_dir / f"logits_{key}_{k}.pth")
    return g_dir, t_dir


def _compare(g, t, *extra):
    proc = layerwatch("compare", str(g), str(t), "--json", *extra)
    return proc, (json.loads(proc.stdout) if proc.stdout.strip() else None)


def test_each_case_gets_its_first_bad_token(folders):
    proc, report = _compare(*folders)
    assert proc.returncode == 1, proc.stderr
    cases = {c["key"]: c for c in report["cases"]}
    assert cases["7"]["verdict"] == "pass" and cases["7"]["first_bad_token"] is None
    assert cases["8"]["verdict"] == "fail"
    assert cases["8"]["first_bad_token"] == FAULT_FROM
    assert report["first_failure"]["key"] == "8" and report["first_failure"]["token"] == FAULT_FROM
    assert report["summary"]["cases"] == 2 and report["summary"]["bad_cases"] == 1
    row = next(r for r in report["rows"] if r["key"] == "8" and r["token"] == FAULT_FROM)
    assert row["metrics"]["kl_divergence"] > 1e-5  # fp32 logits limit; float64 KL, never clamped
    # a bf16 target's rows: KL small but non-zero (msit's bf16 log_softmax reports 0 or 0.01)
    bf16 = [r["metrics"]["kl_divergence"] for r in report["rows"] if r["key"] == "7"]
    assert all(0 < kl < 5e-3 for kl in bf16)


def test_a_near_tie_flip_passes_and_says_so(tmp_path):
    g, t = tmp_path / "g", tmp_path / "t"
    g.mkdir()
    t.mkdir()
    base = torch.randn(VOCAB, generator=torch.Generator().manual_seed(0)) * 2
    base[10], base[11] = 9.0, 8.999  # golden nearly tied
    flipped = base.clone()
    flipped[10], flipped[11] = 8.999, 9.0
    torch.save(base, g / "x_1_0.pth")
    torch.save(flipped, t / "x_1_0.pth")
    confident = base.clone()
    confident[11] = 2.0
    swapped = confident.clone()
    swapped[10], swapped[11] = 2.0, 9.0
    torch.save(confident, g / "x_1_1.pth")
    torch.save(swapped, t / "x_1_1.pth")
    torch.save(base, g / "x_1_2.pth")  # only golden has token 2
    proc, report = _compare(g, t)
    rows = {r["token"]: r for r in report["rows"]}
    assert rows[0]["verdict"] == "pass" and "near-tie" in rows[0]["reason"]
    assert rows[1]["verdict"] == "fail"
    assert rows[2]["verdict"] == "unpaired"
    assert report["cases"][0]["first_bad_token"] == 1
    assert proc.returncode == 1


def test_bad_shapes_and_report_paths(folders, tmp_path):
    g, t = tmp_path / "g", tmp_path / "t"
    g.mkdir()
    t.mkdir()
    torch.save(torch.zeros(2, VOCAB), g / "l_3_0.pth")
    torch.save(torch.zeros(2, VOCAB), t / "l_3_0.pth")
    proc, report = _compare(g, t)
    assert report["rows"][0]["verdict"] == "error"
    assert "expected [V], [1, V] or [1, 1, V]" in report["rows"][0]["reason"]
    proc = layerwatch("compare", str(folders[0]), str(folders[1]), "-o", str(tmp_path / "r.txt"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    out = tmp_path / "r.csv"
    proc = layerwatch("compare", str(folders[0]), str(folders[1]), "-o", str(out))
    assert proc.returncode == 1
    head = out.read_text().splitlines()[0].split(",")
    assert head[:3] == ["key", "token", "verdict"] and "kl_divergence" in head
