"""``layerwatch precheck --replay -- CMD`` on a real bf16 transformers run (tests/live/programs).

The command runs as a user runs it; the replay happens inside it at exit. Benign: exit 0.
A wrong RMSNorm kernel (every norm) and one noisy Linear instance: exit 1, naming the operator.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from .helpers import PROGRAMS, layerwatch

pytest.importorskip("transformers")
PROGRAM = PROGRAMS / "hf_replay.py"
PRECHECK_KEYS = {"summary", "first_failure", "rows", "notes"}


def _replay(tmp_path: Path, mode: str, tokens: int = 6) -> tuple[int, dict, Path]:
    out = tmp_path / f"replay_{mode}"
    res = layerwatch(
        "precheck", "--replay", "--json", "--out", str(out), "-o", str(tmp_path / "r.csv"),
        "--", sys.executable, str(PROGRAM), mode, str(tokens), timeout=240,
    )  # fmt: skip
    assert "Traceback" not in res.stderr, res.stderr
    return res.returncode, json.loads(res.stdout), out


def test_benign_bf16_run_passes_on_a_hundredth_of_a_dump(tmp_path: Path) -> None:
    code, obj, out = _replay(tmp_path, "benign", 32)
    assert code == 0, obj["first_failure"]
    assert set(obj) >= PRECHECK_KEYS and obj["first_failure"] is None
    assert set(obj["summary"]) == {"checked", "failed", "errors", "unsupported"}
    types = {r["type"] for r in obj["rows"]}
    assert {"Linear", "LlamaRMSNorm", "Embedding", "SiLUActivation"} <= types
    assert {r["dtype"] for r in obj["rows"] if r["type"] == "Linear"} == {"bfloat16"}
    assert all(r["verdict"] == "pass" for r in obj["rows"])
    norm = next(r for r in obj["rows"] if r["type"] == "LlamaRMSNorm")
    assert norm["ranges"]["std"] > 0 and norm["calls"] > 1
    replay = obj["replay"]
    assert replay["distinct"] == len(obj["rows"]) < replay["calls"]
    assert not list(out.rglob("*.safetensors"))  # statistics only: no tensor was written
    dump = tmp_path / "dump"  # the same run, fully dumped
    res = layerwatch("dump", "--out", str(dump), "--", sys.executable, str(PROGRAM), "benign", "32")
    assert res.returncode == 0, res.stderr
    full = sum(p.stat().st_size for p in dump.rglob("*") if p.is_file() and p.suffix != ".log")
    assert replay["bytes"] <= 0.01 * full, (replay["bytes"], full)


@pytest.mark.parametrize("arch, dtype", [("gpt2", "fp16"), ("gemma", "bf16")])
def test_benign_runs_of_other_architectures_pass(arch: str, dtype: str) -> None:
    """GPT-2 (Conv1D, LayerNorm, NewGELU, Dropout) and Gemma ((1+w) RMSNorm, scaled embedding,
    tanh GELU): every replayed operator within its bound, with room to spare."""
    res = layerwatch(
        "precheck", "--replay", "--json",
        "--", sys.executable, str(PROGRAM), "benign", "4", arch, dtype, timeout=240,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr
    obj = json.loads(res.stdout)
    assert obj["summary"]["checked"] >= 12 and {r["dtype"] for r in obj["rows"]} >= {
        {"fp16": "float16", "bf16": "bfloat16"}[dtype]
    }
    assert max(r["metrics"]["precheck_ratio"] or 0 for r in obj["rows"]) < 0.7


@pytest.mark.parametrize(
    "mode, node, op",
    [
        ("eps", "root.model.layers.0.input_layernorm", "LlamaRMSNorm"),
        ("noisy", "root.model.layers.1.mlp.down_proj", "Linear"),
    ],
)
def test_a_wrong_kernel_is_named(tmp_path: Path, mode: str, node: str, op: str) -> None:
    code, obj, _ = _replay(tmp_path, mode)
    assert code == 1
    first = obj["first_failure"]
    assert (first["token"], first["node"]) == (0, node), first
    failed = {(r["node"], r["type"]) for r in obj["rows"] if r["verdict"] == "fail"}
    csv_lines = (tmp_path / "r.csv").read_text().splitlines()
    assert csv_lines[0].startswith("token,node,type,tensor,verdict,precheck_ratio")
    assert len(csv_lines) == 1 + len(obj["rows"]) and node in "".join(csv_lines)
    assert {t for _, t in failed} == {op}, failed
    if mode == "noisy":  # the healthy down_proj of layer 0 replays on its own and passes
        assert failed == {(node, op)}
        healthy = [r for r in obj["rows"] if r["node"].endswith("layers.0.mlp.down_proj")]
        assert healthy and all(r["verdict"] == "pass" for r in healthy)


@pytest.mark.parametrize(
    "args, message",
    [
        (["precheck", "--replay"], "no command given"),
        (["precheck", "--replay", "--", "no-such-command-xyz"], "command not found"),
        (["precheck", "--replay", "--", sys.executable, "-c", "print(1)"], "nothing replayed"),
        (["precheck"], "no dump given"),
        (["precheck", "some_dump", "extra"], "a command needs --replay"),
    ],
)
def test_bad_replay_input_is_one_line(args: list[str], message: str) -> None:
    res = layerwatch(*args)
    assert res.returncode == 2, res.stdout
    assert message in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
