"""engine/outcome.mismatch: dumps that do not describe the same run, or that are damaged, end in
one line and exit 2 — never a clean pass — while real findings stay exit 1 and clean runs 0.

Every dump here is a real capture: the tiny HF Llama of tests/fixtures/tiny_llama.py through
``register_hook`` (tests/fixtures/lw_llama_dump.py), and the demo model through its own CLI.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from layerwatch.engine.outcome import MOST_UNPAIRED

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PROMPT = "11,42,7,93"


def layerwatch(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "layerwatch.tui", *map(str, args), "--jobs", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def llama_dump(
    out: Path, prompt: str = PROMPT, new_tokens: int = 3, layers: str = "", noise: float = 0.0
) -> Path:
    subprocess.run(
        [
            sys.executable,
            str(FIXTURES / "lw_llama_dump.py"),
            str(out),
            prompt,
            str(new_tokens),
            layers,
            str(noise),
        ],
        check=True,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
        timeout=180,
    )
    return out


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mismatch")
    made = {
        "golden": llama_dump(root / "golden"),
        "same": llama_dump(root / "same"),
        "prompt": llama_dump(root / "prompt", prompt="11,42,7,94"),
        "short": llama_dump(root / "short", new_tokens=2),
        "mlp": llama_dump(root / "mlp", layers="root.model.layers.1.mlp*"),
        "fault": llama_dump(root / "fault", noise=50.0),
    }
    demo = root / "demo"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "layerwatch.capture.demo",
            "--new-tokens",
            "3",
            "--layers",
            "2",
            "--dump",
            str(demo),
        ],
        check=True,
        capture_output=True,
        timeout=180,
    )
    made["demo"] = demo
    return made


def payload(dump: Path) -> Path:
    (data,) = dump.glob("*/data/*.safetensors")
    return data


def damaged(dumps: dict[str, Path], tmp_path: Path, name: str) -> Path:
    copy = tmp_path / name
    shutil.copytree(dumps["same"], copy)
    return copy


def one_line_exit_2(done: subprocess.CompletedProcess[str], *words: str) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    command = done.args[3]
    # headless open prints its progress on stderr too: the verdict is one line, the last
    lines = [x for x in done.stderr.splitlines() if x.startswith(f"layerwatch {command}:")]
    assert len(lines) == 1 and done.stderr.strip().endswith(lines[0]), done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_the_same_run_twice_is_clean(dumps: dict[str, Path]) -> None:
    done = layerwatch("compare", dumps["golden"], dumps["same"])
    assert done.returncode == 0, done.stderr
    assert "0 unpaired" in done.stdout and done.stderr == ""


def test_another_model_and_prompt_is_a_mismatch_not_a_pass(dumps: dict[str, Path]) -> None:
    done = layerwatch("compare", dumps["golden"], dumps["demo"])
    line = one_line_exit_2(done, "do not look like the same model and prompt", "unpaired")
    assert "golden prompt 4 ids, target 16 ids" in line
    assert "pairs: " in done.stdout  # the summary still says what was (not) paired
    # --allow-partial waives only the unpaired share: no pair passed or failed is still 2
    one_line_exit_2(
        layerwatch("compare", dumps["golden"], dumps["demo"], "--allow-partial"), "prompt"
    )


def test_another_prompt_at_token_0_is_a_mismatch(dumps: dict[str, Path]) -> None:
    line = one_line_exit_2(layerwatch("compare", dumps["golden"], dumps["prompt"]), "same prompt")
    assert "[11, 42, 7, 93]" in line and "[11, 42, 7, 94]" in line


def test_a_sub_graph_needs_allow_partial(dumps: dict[str, Path]) -> None:
    """One MLP of a two-layer model: far more than MOST_UNPAIRED of all tensors unpaired."""
    done = layerwatch("compare", dumps["golden"], dumps["mlp"], "--json")
    summary = json.loads(done.stdout)["summary"]
    share = summary["unpaired"] / (2 * summary["pairs"] + summary["unpaired"])
    assert share > MOST_UNPAIRED and summary["pass"] == summary["pairs"] > 0
    one_line_exit_2(done, "same model", "--allow-partial")
    partial = layerwatch("compare", dumps["golden"], dumps["mlp"], "--allow-partial")
    assert partial.returncode == 0, partial.stderr


def test_one_token_missing_is_reported_unpaired_not_a_mismatch(dumps: dict[str, Path]) -> None:
    """A run stopped one token early: a third of the golden's tensors have no partner
    (below the MOST_UNPAIRED share), everything else passes."""
    done = layerwatch("compare", dumps["golden"], dumps["short"], "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)["summary"]
    assert summary["unpaired"] > 0 and summary["fail"] == summary["error"] == 0
    assert summary["unpaired"] < MOST_UNPAIRED * (2 * summary["pairs"] + summary["unpaired"])


@pytest.mark.parametrize("front_end", [("compare",), ("open", "--headless")])
def test_a_payload_cut_to_100_bytes_is_unusable_input(
    dumps: dict[str, Path], tmp_path: Path, front_end: tuple[str, ...]
) -> None:
    cut = damaged(dumps, tmp_path, "cut")
    with open(payload(cut), "r+b") as fh:
        fh.truncate(100)
    done = layerwatch(*front_end, dumps["golden"], cut)
    one_line_exit_2(done, "could not be read", "truncated")


@pytest.mark.parametrize("keep", [0.3, 0.6, 0.95])
def test_a_payload_cut_part_way_keeps_every_tensor_before_the_cut(
    dumps: dict[str, Path], tmp_path: Path, keep: float
) -> None:
    cut = damaged(dumps, tmp_path, "cut")
    data = payload(cut)
    size = int(data.stat().st_size * keep)
    with open(data, "r+b") as fh:
        fh.truncate(size)
    done = layerwatch("compare", dumps["golden"], cut, "--json", "--allow-partial")
    rows = json.loads(done.stdout)["rows"]
    index = [json.loads(line) for line in next(cut.glob("*/index.jsonl")).read_text().splitlines()]
    ends = {(e["token"], e["node"], e["stem"]): e["end"] for e in index if e["k"] == "t"}
    assert rows and all(row["verdict"] != "unpaired" for row in rows)
    for row in rows:
        end = ends[row["token"], row["node"], row["tensor"]]
        if end <= size:
            assert row["verdict"] == "pass", row
        else:
            assert row["verdict"] == "error" and "truncated" in row["reason"], row
    assert done.returncode == 1  # unreadable pairs beside passing ones: a finding to look at


def test_a_random_bytes_payload_is_unusable_input(dumps: dict[str, Path], tmp_path: Path) -> None:
    """Same size as the real payload, so every offset in the index is in range: only the
    safetensors header tells it is not ours (before, it was read as numbers: FAIL, exit 1)."""
    junk = damaged(dumps, tmp_path, "junk")
    data = payload(junk)
    data.write_bytes(os.urandom(data.stat().st_size))
    one_line_exit_2(layerwatch("compare", dumps["golden"], junk), "not a safetensors file")


@pytest.mark.parametrize(("fault", "code"), [("noisy_weight", 1), ("none", 0)])
def test_demo_headless_exits_as_compare_would(fault: str, code: int) -> None:
    """The planted fault found is a finding (1), as compare says it; the clean demo is 0."""
    args = ["demo", "--headless", "--new-tokens", "2", "--fault", fault]
    done = subprocess.run(
        [sys.executable, "-m", "layerwatch.tui", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == code, done.stderr[-2000:]
    assert ("first failure:   none" in done.stdout) == (code == 0), done.stdout


def test_same_tokens_have_no_divergence_record(dumps: dict[str, Path]) -> None:
    done = layerwatch("compare", dumps["golden"], dumps["same"], "--json")
    report = json.loads(done.stdout)
    assert "divergence" in report and report["divergence"] is None


def test_a_confident_flip_is_a_divergence_record_and_a_finding(dumps: dict[str, Path]) -> None:
    """Noise of 50 weight stds in one down_proj: the first generated token differs, and the
    golden preferred its token by more than the fp32 margin bound (engine/thresholds.toml)."""
    done = layerwatch("compare", dumps["golden"], dumps["fault"], "--json")
    report = json.loads(done.stdout)
    parted = report["divergence"]
    ids = {}
    for side in ("golden", "fault"):
        index = next(dumps[side].glob("*/index.jsonl")).read_text().splitlines()
        tokens = [json.loads(x) for x in index if '"k":"token"' in x]
        ids[side] = {t["token"]: t["input_ids"] for t in tokens}
    first = min(t for t in ids["golden"] if ids["golden"][t] != ids["fault"][t])
    assert parted["token"] == first - 1
    assert parted["golden_id"] == ids["golden"][first][-1]
    assert parted["target_id"] == ids["fault"][first][-1]
    assert parted["golden_margin"] > 0.02 and parted["near_tie"] is False
    assert parted["not_compared"]["tokens"] == list(range(first, 3))
    assert parted["not_compared"]["pairs"] == report["summary"]["diverged"] > 0
    assert report["first_bad_token"] is not None and report["first_bad_token"] <= parted["token"]
    assert done.returncode == 1
    text = layerwatch("compare", dumps["golden"], dumps["fault"]).stdout.splitlines()
    assert text[0].startswith(f"outputs differ from step {parted['token']}: the target chose")
    assert "layerwatch dump --follow GOLDEN" in text[1]


def test_headless_open_says_where_the_outputs_part(dumps: dict[str, Path]) -> None:
    """The live printer's line (once, as soon as the diverged token landed), then compare's
    summary with the same sentence first."""
    done = layerwatch("open", "--headless", dumps["golden"], dumps["fault"])
    said = [x for x in done.stderr.splitlines() if "outputs differ from step" in x]
    assert len(said) == 1, done.stderr
    assert done.stdout.startswith(said[0].removeprefix("layerwatch: ").split(";")[0])
    # said while tokens still land: no step range or counts, which depend on how many had
    assert said[0].endswith("; the steps after it are not compared"), said[0]
    assert done.returncode == 1
