"""``layerwatch scan``: anomalies of one run without a golden, on real tiny transformers.

Faults are real edits of the model (a weight scaled until fp16 overflows, an activation that
makes NaN, a kernel that saturates or writes zeros), captured with ``register_hook``; the
scan must name the node where the damage starts, not where it propagates to. Benign fp16/bf16
runs of three architectures must raise nothing (the calibration of the jump rule).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from layerwatch.engine.numerics import anomaly
from layerwatch.engine.scan import APPEARS, INSIDE, PROPAGATED, scan_dump
from support import tiny_hf

pytest.importorskip("transformers")


def _layerwatch(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "layerwatch.tui.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("arch", tiny_hf.ARCHS)
def test_benign_runs_raise_nothing(arch: str, dtype: torch.dtype, tmp_path: Path) -> None:
    run = tiny_hf.capture(tiny_hf.build(arch, dtype), tmp_path)
    report = scan_dump(str(run))
    assert report.rows == [] and report.first_failure is None
    assert report.tokens == 1 + tiny_hf.NEW_TOKENS - 1 and report.loaded == 0  # stats only
    ratio, _ = report.peak_ratio
    assert ratio < anomaly.JUMP_RATIO / 10  # the headroom anomaly.py documents


@pytest.mark.parametrize("side", ["stats_golden", "tensor_golden"])
def test_msprobe_api_dumps_with_masks_raise_nothing(side: str) -> None:
    """msprobe dumps the API calls that build and add the attention mask (``torch.where`` →
    finfo.min, ``Tensor.__add__``): values at finfo.min by design, not a saturation."""
    fixture = Path(__file__).parents[1] / "fixtures" / "msprobe" / side
    report = scan_dump(str(fixture))
    assert report.rows == [] and report.tensors > 50


class _Scores(torch.nn.Module):
    """Attention-like scores with a causal mask added, built with ``fill`` (−inf as nanoGPT
    and the demo model do, or +inf: never a mask)."""

    def __init__(self, fill: float) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.fill = fill

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.proj(x) @ x.transpose(-1, -2)
        mask = torch.full(scores.shape[-2:], self.fill).triu(1)
        return scores + mask


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_a_causal_mask_of_minus_inf_is_no_anomaly(dtype: str, tmp_path: Path) -> None:
    """Scores masked with −inf hold Infs by design, as finfo.min masks hold saturated values:
    the payload says every Inf is negative, so the benign demo (its causal mask is −inf) and a
    −inf mask raise nothing, while +inf in the same place is still an Inf that appears."""
    from layerwatch.capture import DumpConfig, register_hook
    from layerwatch.capture.demo import build_model, generate

    model = build_model(dtype=dtype)
    with register_hook(model, DumpConfig(dump_path=str(tmp_path / "demo"))):
        generate(model, new_tokens=4)
    demo = scan_dump(str(tmp_path / "demo"))
    assert demo.rows == [] and demo.first_failure is None and demo.tensors > 100
    found = {}
    for fill in (float("-inf"), float("inf")):
        out = tmp_path / str(fill)
        model = _Scores(fill).eval()
        with register_hook(model, DumpConfig(dump_path=str(out))), torch.no_grad():
            model(torch.randn(1, 3, 4))
        found[fill] = scan_dump(str(out)).first_failure
    assert found[float("-inf")] is None
    plus = found[float("inf")]
    assert plus is not None and anomaly.INF in plus.kinds and plus.status == APPEARS


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_fp16_overflow_is_found_where_it_appears(arch: str, tmp_path: Path) -> None:
    model = tiny_hf.build(arch, torch.float16)
    tiny_hf.scale_weight(model, tiny_hf.MLP_IN[arch], 5e5)  # fits fp16; its products do not
    report = scan_dump(str(tiny_hf.capture(model, tmp_path)))
    first = report.first_failure
    assert first is not None and first.key.token == 0
    assert first.key.node == "root." + tiny_hf.MLP_IN[arch]
    assert first.status == APPEARS and anomaly.INF in first.kinds
    statuses = {r.status for r in report.rows}
    assert PROPAGATED in statuses  # downstream nodes see Inf/NaN come in
    earlier = [r for r in report.rows if (r.key.token, r.order) < (first.key.token, first.order)]
    assert earlier == []


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_nan_op_is_found_at_its_node(arch: str, tmp_path: Path) -> None:
    model = tiny_hf.build(arch, torch.float16)
    tiny_hf.set_module(model, tiny_hf.ACT[arch], tiny_hf.Lambda(torch.log))  # log(<0) = NaN
    report = scan_dump(str(tiny_hf.capture(model, tmp_path)))
    first = report.first_failure
    assert first is not None and first.key.node == "root." + tiny_hf.ACT[arch]
    assert first.anomaly == anomaly.NAN and first.key.token == 0
    parent = "root." + tiny_hf.ACT[arch].rsplit(".", 1)[0]  # the MLP around it
    mlp = [r for r in report.rows if r.key.node == parent and r.key.token == 0]
    assert mlp and mlp[0].status == INSIDE


def test_a_cache_carrying_nan_into_later_tokens_is_named(tmp_path: Path) -> None:
    """NaN in k_proj at prefill only: later tokens' attention sees it through the KV cache
    (its inputs are clean), and the first failure stays at prefill's k_proj."""
    model = tiny_hf.build("qwen2", torch.float16)
    k_proj = model.model.layers[0].self_attn.k_proj
    calls = []

    def nan_once(module, args, output):
        calls.append(1)
        return output * float("nan") if len(calls) == 1 else output

    k_proj.register_forward_hook(nan_once)
    report = scan_dump(str(tiny_hf.capture(model, tmp_path)))
    first = report.first_failure
    assert first is not None and (first.key.token, first.key.node) == (
        0,
        "root.model.layers.0.self_attn.k_proj",
    )
    later = [r for r in report.rows if r.key.token == 2 and r.status == APPEARS]
    assert later and all("token 0 was already anomalous" in r.reason() for r in later)


def test_saturation_zero_and_jump(tmp_path: Path) -> None:
    model = tiny_hf.build("llama", torch.float16)
    tiny_hf.set_module(
        model,
        tiny_hf.ACT["llama"],
        tiny_hf.Lambda(lambda x: (x.float() * 1e6).clamp(-65504, 65504).half()),
    )
    with torch.no_grad():
        model.model.layers[0].self_attn.o_proj.weight.zero_()
    report = scan_dump(str(tiny_hf.capture(model, tmp_path / "a")))
    zero = report.first_failure
    assert zero is not None and zero.key.node == "root.model.layers.0.self_attn.o_proj"
    assert zero.anomaly == anomaly.ZERO
    sat = [r for r in report.rows if r.key.node == "root." + tiny_hf.ACT["llama"]]
    assert sat and sat[0].anomaly == anomaly.SATURATED and sat[0].status == APPEARS

    model = tiny_hf.build("qwen2", torch.bfloat16)  # bf16 keeps the huge values finite
    tiny_hf.scale_weight(model, tiny_hf.MLP_IN["qwen2"], 1e5)
    report = scan_dump(str(tiny_hf.capture(model, tmp_path / "b")))
    first = report.first_failure
    assert first is not None and first.key.node == "root." + tiny_hf.MLP_IN["qwen2"]
    assert first.kinds == (anomaly.JUMP,) and first.ratio > anomaly.JUMP_RATIO


def test_cli_json_report_and_exit_codes(tmp_path: Path) -> None:
    model = tiny_hf.build("llama", torch.float16)
    tiny_hf.set_module(model, tiny_hf.ACT["llama"], tiny_hf.Lambda(torch.log))
    run = tiny_hf.capture(model, tmp_path / "dump")
    out = _layerwatch("scan", tmp_path / "dump", "--json", "-o", tmp_path / "r.csv")
    assert out.returncode == 1, out.stderr
    obj = json.loads(out.stdout)
    assert set(obj) == {"summary", "first_failure", "rows"}
    assert obj["first_failure"]["node"] == "root.model.layers.1.mlp.act_fn"
    assert obj["first_failure"]["status"] == "appears" and obj["summary"]["payloads_read"] == 0
    assert (tmp_path / "r.csv").read_text().startswith("token,rank,node,tensor")
    text = _layerwatch("scan", run)
    assert text.returncode == 1 and "first anomaly: token 0" in text.stdout
    assert "root.model.layers.1.mlp.act_fn" in text.stdout


def test_a_report_file_alone_still_names_a_cut_short_index_on_stderr(tmp_path: Path) -> None:
    """``-o`` prints no summary; the note that the index ends part-way through a line is said
    on stderr all the same, and the scan of every whole line goes on."""
    run = tiny_hf.capture(tiny_hf.build("llama", torch.float16), tmp_path / "dump")
    index = next(Path(run).rglob("index.jsonl"))
    index.write_bytes(index.read_bytes() + b'{"k":"t","token":')
    out = _layerwatch("scan", run, "-o", tmp_path / "r.csv")
    assert out.returncode == 0 and out.stdout == "", out.stderr
    assert out.stderr.count("cut short") == 1 and out.stderr.startswith("note: "), out.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["{tmp}/missing"], "no such file or directory"),
        (["{tmp}"], "is not a dump"),
        (["{tmp}", "-o", "{tmp}/r.txt"], "a report file ends in"),
        (["{tmp}", "--jump-ratio", "0"], "--jump-ratio must be"),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    (tmp_path / "x.txt").write_text("not a dump")
    out = _layerwatch("scan", *[a.format(tmp=tmp_path) for a in args])
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr
    assert lines[0].startswith("layerwatch scan: ") and message in lines[0]


def test_a_truncated_payload_is_a_note_and_the_rest_is_scanned(tmp_path: Path) -> None:
    """A dump without statistics (msit layout) makes scan read payloads; a cut one is named in
    a note and left out, every other tensor is scanned and the exit code is the scan's own."""
    from layerwatch.capture import DumpConfig

    model = tiny_hf.build("llama", torch.float16)
    tiny_hf.capture(model, tmp_path, DumpConfig(dump_path=tmp_path, format="msit"))
    clean = _layerwatch("scan", tmp_path, "--json")
    assert clean.returncode == 0, clean.stderr
    whole = json.loads(clean.stdout)["summary"]
    assert whole["payloads_read"] > 0
    victim = next(tmp_path.rglob("root.model.layers.0.mlp.up_proj/output.pth"))
    victim.write_bytes(victim.read_bytes()[:100])
    out = _layerwatch("scan", tmp_path, "--json")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    summary = json.loads(out.stdout)["summary"]
    assert summary["tensors"] == whole["tensors"] - 1
    assert summary["payloads_read"] == whole["payloads_read"] - 1
    assert [n for n in summary["notes"] if str(victim) in n and "truncated" in n]
    text = _layerwatch("scan", tmp_path)
    assert text.returncode == 0 and f"note: {victim}: truncated" in text.stdout
