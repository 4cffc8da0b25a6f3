"""``layerwatch compare``: exit codes, one-line errors, CSV columns and order, the JSON shape.

Runs the real command in subprocesses on dumps written by msit 8.2.0 itself (tests/fixtures/msit:
a tiny HF Llama, the target with noise in layer 1 ``mlp.down_proj``).
"""

from __future__ import annotations

import csv
import json
import os
import pty
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from layerwatch.engine.report import CSV_COLUMNS, MSIT_COLUMNS

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "msit"
GOLDEN = FIXTURES / "golden" / "msit_dump_fixture"
TARGET = FIXTURES / "target" / "msit_dump_fixture"
BAD = "root.model.layers.1.mlp.down_proj"


def layerwatch(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "layerwatch.tui", "compare", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


def test_identical_dumps_exit_0_with_a_summary() -> None:
    out = layerwatch(GOLDEN, GOLDEN)
    assert out.returncode == 0, out.stderr
    assert "first failure:   none" in out.stdout and " 0 fail " in out.stdout
    assert out.stderr == ""  # no progress when stderr is not a terminal


def test_faulty_target_exit_1_names_token_layer_operator() -> None:
    out = layerwatch(GOLDEN, TARGET)
    assert out.returncode == 1, out.stderr
    assert "first bad token: 0" in out.stdout
    assert "root cause:      token 0 · layer 1 · mlp.down_proj · cos 0.98" in out.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{tmp}/missing", str(TARGET)], "golden dump {tmp}/missing: no such file or directory"),
        ([str(GOLDEN), "{tmp}"], "is not a dump layerwatch can read"),
        ([str(GOLDEN), str(TARGET), "--tokens", "3-1"], "bad token range"),
        ([str(GOLDEN), str(TARGET), "--tokens", "x"], "bad token selection"),
        ([str(GOLDEN), str(TARGET), "--map", "{tmp}/nope.toml"], "cannot read mapping file"),
        (
            [str(GOLDEN), str(TARGET), "--thresholds", "{tmp}/nope.toml"],
            "cannot read thresholds file",
        ),
        ([str(GOLDEN), str(TARGET), "--tokens", "40-50"], "nothing to compare"),
    ],
)
def test_bad_input_exit_2_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    out = layerwatch(*[a.format(tmp=tmp_path) for a in args])
    assert out.returncode == 2
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr
    assert lines[0].startswith("layerwatch compare: ") and message.format(tmp=tmp_path) in lines[0]


def test_argparse_usage_error_is_exit_2() -> None:
    out = layerwatch(GOLDEN)
    assert out.returncode == 2 and "Traceback" not in out.stderr


def test_unreadable_tensor_file_is_reported_not_fatal(tmp_path: Path) -> None:
    target = tmp_path / "target"
    shutil.copytree(TARGET, target)
    victim = (
        target
        / "torch_tensors"
        / "cpu_2000"
        / "0"
        / "root.model.layers.0.mlp.up_proj"
        / "output.pth"
    )
    victim.write_bytes(victim.read_bytes()[:100])  # truncated
    out = layerwatch(GOLDEN, target, "--json")
    assert out.returncode == 1
    report = json.loads(out.stdout)
    rows = [
        r
        for r in report["rows"]
        if r["node"] == "root.model.layers.0.mlp.up_proj"
        and r["tensor"] == "output"
        and r["token"] == 0
    ]
    assert len(rows) == 1 and rows[0]["verdict"] in ("error", "unpaired") and rows[0]["reason"]


def test_csv_has_msit_columns_then_ours_in_report_order(tmp_path: Path) -> None:
    report = tmp_path / "report.csv"
    out = layerwatch(GOLDEN, TARGET, "-o", report)
    assert out.returncode == 1 and out.stdout == ""
    with open(report, newline="") as fh:
        rows = list(csv.reader(fh))
    header, body = rows[0], rows[1:]
    assert header[:24] == list(MSIT_COLUMNS) and len(MSIT_COLUMNS) == 24
    assert header == list(CSV_COLUMNS)
    assert header[24:] == [
        "verdict",
        "failed_metrics",
        "reason",
        "node_type",
        "exec_order",
        "local_error",
        "input_error",
    ]
    col = {name: i for i, name in enumerate(header)}
    keys = [(int(r[col["token_id"]]), int(r[col["exec_order"]])) for r in body]
    assert keys == sorted(keys)
    assert [int(r[col["data_id"]]) for r in body] == list(range(len(body)))
    down = next(r for r in body if r[col["golden_data_path"]].endswith(f"0/{BAD}/output.pth"))
    assert down[col["verdict"]] == "fail" and "cosine_similarity" in down[col["failed_metrics"]]
    assert down[col["golden_dtype"]] == "torch.float32" and down[col["golden_shape"]].startswith(
        "[1, 4, "
    )
    assert float(down[col["cosine_similarity"]]) < 0.999
    assert down[col["kl_divergence"]] == ""  # KL applies to logits only
    lm = next(r for r in body if r[col["golden_data_path"]].endswith("0/root.lm_head/output.pth"))
    assert lm[col["kl_divergence"]] != ""
    assert down[col["node_type"]] == "Linear"


def test_json_shape_is_stable() -> None:
    out = layerwatch(GOLDEN, TARGET, "--json")
    assert out.returncode == 1
    report = json.loads(out.stdout)
    assert set(report) == {
        "summary",
        "first_failure",
        "root_cause",
        "first_bad_token",
        "divergence",
        "rows",
    }
    assert report["divergence"] is None  # both sides generated the same tokens
    assert set(report["summary"]) == {"pairs", "pass", "fail", "diverged", "unpaired", "error"}
    s = report["summary"]
    assert s["pairs"] == s["pass"] + s["fail"] + s["diverged"] + s["error"] and s["fail"] > 0
    finding_keys = {
        "token",
        "node",
        "tensor",
        "rank",
        "verdict",
        "failed_metrics",
        "metrics",
        "reason",
    }
    for name in ("first_failure", "root_cause"):
        assert set(report[name]) == finding_keys
    assert report["root_cause"]["node"] == BAD and report["root_cause"]["tensor"] == "output"
    assert report["first_bad_token"] == 0
    assert report["rows"] and all(
        set(r) == {"token", "node", "tensor", "rank", "verdict", "metrics", "reason"}
        for r in report["rows"]
    )
    assert "cosine_similarity" in report["first_failure"]["metrics"]
    assert {r["tensor"] for r in report["rows"]} >= {"output", "input_0"}


def test_tokens_option_limits_rows() -> None:
    out = layerwatch(GOLDEN, TARGET, "--json", "--tokens", "1-2")
    report = json.loads(out.stdout)
    assert {r["token"] for r in report["rows"]} == {1, 2}


def test_no_torch_no_pandas_on_the_compare_path() -> None:
    code = (
        "import sys; from layerwatch.tui.cli import main; "
        f"rc = main(['compare', {str(GOLDEN)!r}, {str(TARGET)!r}, '--json']); "
        "sys.stderr.write(repr(sorted(m for m in ('torch', 'pandas', 'textual') if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stderr.strip() == "[]"


def test_progress_only_on_a_terminal() -> None:
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "layerwatch.tui", "compare", str(GOLDEN), str(TARGET), "--json"],
            stdout=subprocess.PIPE,
            stderr=slave,
            text=True,
        )
        stdout, _ = proc.communicate(timeout=120)
        os.close(slave)
        slave = -1
        chunks = []
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)
    err = b"".join(chunks).decode()
    assert "layerwatch compare:" in err and "pairs" in err
    json.loads(stdout)  # stdout stays clean JSON


def test_the_process_ends_with_all_of_its_output(capsys: pytest.CaptureFixture[str]) -> None:
    """A compare process leaves without the interpreter's shutdown (tui/cli.py ``_quick_exit``):
    stdout and the exit code are those of the same compare run in-process, which returns."""
    from layerwatch.tui.cli import main

    code = main(["compare", str(GOLDEN), str(TARGET), "--json"])
    in_process = capsys.readouterr().out
    out = layerwatch(GOLDEN, TARGET, "--json")
    assert (out.returncode, out.stdout) == (code, in_process) == (1, in_process)
    assert json.loads(out.stdout)["summary"]["fail"] > 0


def test_a_reader_leaving_early_is_not_an_error() -> None:
    """``compare --json | head -c 10``: the closed pipe at the last flush is exit 0, no traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "layerwatch.tui", "compare", str(GOLDEN), str(TARGET), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(10) == b'{"summary"'
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, err
    assert b"Traceback" not in err
