"""``layerwatch allreduce`` without torchrun: synthetic layerwatch rank directories
(tests/support/tp_dumps.py), ATB dumps of two devices (tests/support/atb.py), one path per
rank, every reduction op, and the one-line refusals. torchrun captures are checked in
tests/engine/test_tensor_parallel.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from layerwatch.engine.allreduce import check_allreduce
from layerwatch.tui.cli import main
from support.atb import Op, write_dump
from support.tp_dumps import write_allreduce_dump


@pytest.mark.parametrize("op", ["SUM", "MAX", "MIN", "AVG", "PRODUCT"])
def test_every_reduction_op_is_its_own_golden(tmp_path: Path, op: str) -> None:
    write_allreduce_dump(tmp_path, 3, 8, 64, op=op, bad=(5, 2))
    report = check_allreduce(tmp_path)
    assert report.summary()["checked"] == 8 and len(report.rows) == 24
    first = report.first_failure
    assert first is not None and (first.token, first.rank, first.op) == (1, 2, op)
    assert sum(r.verdict.value == "fail" for r in report.rows) == 1


def test_bf16_rounding_of_a_true_sum_passes(tmp_path: Path) -> None:
    write_allreduce_dump(tmp_path, 4, 4, 256, "bfloat16")
    report = check_allreduce(tmp_path)
    assert report.first_failure is None and {r.dtype for r in report.rows} == {"bfloat16"}


def test_atb_allreduce_operators_of_each_device(tmp_path: Path) -> None:
    """msit's workflow: ATB_SAVE_TENSOR_RUNNER=AllReduceHcclRunner, one folder per device."""
    rng = np.random.default_rng(0)
    inputs = [[rng.standard_normal((2, 8)).astype(np.float32) for _ in range(2)] for _ in range(3)]
    for device in (0, 1):
        tokens = []
        for t in range(3):
            out = inputs[t][0] + inputs[t][1]
            if (device, t) == (1, 2):
                out = out * np.float32(1.05)
            tokens.append([Op("AllReduceOperation", [inputs[t][device]], [out])])
        write_dump(tmp_path, tokens, device=device, pid=700 + device)
    report = check_allreduce(tmp_path)
    assert report.summary()["checked"] == 3
    first = report.first_failure
    assert first is not None and (first.token, first.node, first.rank) == (
        2,
        "root.0_AllReduceOperation",
        1,
    )


def test_one_path_per_rank_and_the_report_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dump = tmp_path / "d"
    dump.mkdir()
    write_allreduce_dump(dump, 2, 4, 32, bad=(3, 0))
    out = tmp_path / "ar.jsonl"
    code = main(["allreduce", str(dump / "rank0"), str(dump / "rank1"), "-o", str(out)])
    assert code == 1 and capsys.readouterr().out == ""
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 9 and lines[-1]["first_failure"]["rank"] == 0
    csv = tmp_path / "ar.csv"
    assert main(["allreduce", str(dump), "-o", str(csv)]) == 1
    header = csv.read_text().splitlines()[0].split(",")
    assert header[:4] == ["token", "node", "rank", "op"] and "cosine_similarity" in header


def test_unusable_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["allreduce", str(tmp_path / "nope")]) == 2
    assert "no such directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["allreduce", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert "holds no all-reduce calls" in err and err.count("\n") == 1
    write_allreduce_dump(tmp_path / "empty", 2, 2, 8)
    assert main(["allreduce", str(tmp_path / "empty"), "-o", str(tmp_path / "x.txt")]) == 2
    assert ".csv" in capsys.readouterr().err
