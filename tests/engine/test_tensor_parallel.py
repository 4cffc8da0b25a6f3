"""Tensor parallel end to end: torchrun (2 ranks, gloo) captures, ``allreduce``, ``compare``.

The toy model is tests/support/tp_model.py (column-parallel ``up``, row-parallel ``down`` with
its all-reduce, 2 layers, 3 decode steps). Four captures per module run, each a few seconds:
the single-card golden, a benign TP=2 run under ``layerwatch dump`` (no code change), and two
faults captured with ``register_hook``: rank 1's all-reduce result corrupted by the program's
own wrapper (layer 1, token 1), and rank 1 loading rank 0's ``up`` shard of layer 1
(tests/support/tp_capture.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from layerwatch.tui.cli import main
from support.scale import whole_run_report, windowed_report
from support.tp_capture import capture_tp_dumps


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return capture_tp_dumps(tmp_path_factory.mktemp("tp"))


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = main([*argv, "--json"])
    text = capsys.readouterr().out
    return code, json.loads(text) if text.strip() else {}


def test_each_rank_writes_its_own_directory_with_rank_and_collectives(
    dumps: dict[str, Path],
) -> None:
    ranks = sorted(p.name for p in dumps["benign"].iterdir() if p.is_dir())
    assert ranks == ["rank0", "rank1"]
    for r in (0, 1):
        rank_dir = dumps["benign"] / f"rank{r}"
        manifest = json.loads((rank_dir / "manifest.json").read_text())
        assert (manifest["rank"], manifest["world_size"], manifest["backend"]) == (r, 2, "gloo")
        lines = [json.loads(x) for x in (rank_dir / "index.jsonl").read_text().splitlines()]
        stems = {
            (x["token"], x["stem"])
            for x in lines
            if x.get("node") == "root.layers.1.down.all_reduce.0" and x["k"] == "t"
        }
        assert stems == {(t, s) for t in range(3) for s in ("input_0", "output")}
        ops = [x for x in lines if x["k"] == "collective"]
        assert len(ops) == 6 and {x["op"] for x in ops} == {"SUM"}
        assert {x["rank"] for x in ops} == {r}


def test_allreduce_check_passes_a_benign_run(
    dumps: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = _cli(capsys, "allreduce", str(dumps["benign"]))
    assert code == 0, report
    assert report["summary"]["checked"] == 6 and report["summary"]["pass"] == 12
    assert {row["rank"] for row in report["rows"]} == {0, 1}
    assert report["first_failure"] is None


def test_allreduce_check_finds_the_corrupted_rank(
    dumps: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = _cli(capsys, "allreduce", str(dumps["allreduce"]))
    assert code == 1
    first = report["first_failure"]
    assert (first["token"], first["node"], first["rank"]) == (
        1,
        "root.layers.1.down.all_reduce.0",
        1,
    )
    assert report["summary"]["fail"] == 1  # rank 0's result of that call is right


def test_compare_benign_tp_against_one_card_raises_nothing(
    dumps: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = _cli(capsys, "compare", str(dumps["golden"]), str(dumps["benign"]))
    assert code == 0, report["first_failure"]
    rows = report["rows"]
    assert {r["rank"] for r in rows} == {0, 1}
    assert all(r["verdict"] == "pass" for r in rows)
    up = {(r["rank"], r["tensor"]) for r in rows if r["node"] == "root.layers.0.up"}
    assert up == {(0, "input_0"), (0, "output"), (1, "input_0"), (1, "output")}


def test_compare_finds_a_fault_at_its_rank(
    dumps: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = _cli(capsys, "compare", str(dumps["golden"]), str(dumps["allreduce"]))
    assert code == 1
    first = report["first_failure"]
    assert (first["token"], first["node"], first["rank"]) == (1, "root.layers.1.down", 1)
    code, report = _cli(capsys, "compare", str(dumps["golden"]), str(dumps["shard"]))
    assert code == 1
    first = report["first_failure"]
    assert (first["token"], first["node"], first["rank"]) == (0, "root.layers.1.up", 1)
    assert report["root_cause"]["rank"] == 1


def test_one_rank_alone_and_rank_against_rank(
    dumps: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = _cli(capsys, "compare", str(dumps["golden"]), str(dumps["benign"] / "rank1"))
    assert code == 0 and {r["rank"] for r in report["rows"]} == {1}
    code, report = _cli(
        capsys, "compare", str(dumps["benign"] / "rank1"), str(dumps["allreduce"] / "rank1")
    )
    assert code == 1
    assert (report["first_failure"]["token"], report["first_failure"]["rank"]) == (1, 1)
    code = main(["allreduce", str(dumps["benign"] / "rank1")])
    assert code == 2
    assert "rank 1 of 2" in capsys.readouterr().err


def test_missing_and_truncated_ranks_are_named_and_the_rest_compared(
    dumps: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "missing"
    shutil.copytree(dumps["benign"], missing)
    shutil.rmtree(missing / "rank1")
    assert main(["allreduce", str(missing)]) == 2
    assert "rank 1 of 2 is missing" in capsys.readouterr().err
    assert main(["compare", str(dumps["golden"]), str(missing)]) == 0
    out = capsys.readouterr().out
    assert "rank 1 of 2 has no tensors" in out

    cut = tmp_path / "cut"
    shutil.copytree(dumps["benign"], cut)
    index = cut / "rank1" / "index.jsonl"
    lines = index.read_text().splitlines(keepends=True)
    index.write_text("".join(x for x in lines if json.loads(x).get("token", 9) == 0))
    code, report = _cli(capsys, "allreduce", str(cut))
    assert code == 0
    assert report["summary"]["checked"] == 2 and report["summary"]["unchecked"] == 4
    assert any("rank 1: its dump did not finish" in n for n in report["notes"])
    code, report = _cli(capsys, "compare", str(dumps["golden"]), str(cut))
    assert code == 0
    ranks = {(r["rank"], r["token"]) for r in report["rows"]}
    assert (0, 2) in ranks and (1, 0) in ranks and (1, 2) not in ranks


def test_open_headless_spreads_the_golden_like_compare(
    dumps: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """``open`` goes through the live pipeline (records in batches, golden first): the same
    rows as ``compare``."""
    rows = {}
    for command in ("compare", "open"):
        extra = ("--headless",) if command == "open" else ()
        code, report = _cli(capsys, command, str(dumps["golden"]), str(dumps["allreduce"]), *extra)
        assert code == 1
        rows[command] = {
            (r["token"], r["node"], r["tensor"], r["rank"], r["verdict"]) for r in report["rows"]
        }
        first = report["first_failure"]
        assert (first["token"], first["node"], first["rank"]) == (1, "root.layers.1.down", 1)
    assert rows["open"] == rows["compare"]


@pytest.mark.parametrize("target", ["shard", "allreduce", "rank1", "cut"])
def test_a_tp_compare_in_windows_writes_the_whole_run_report(
    dumps: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str
) -> None:
    """A window of tokens at a time (a token or less each), the golden spread over each
    window's ranks: the report of the whole-run spread byte for byte — also with a rank cut
    short, whose tokens wait for the end instead of closing without it."""
    path = dumps["benign"] / "rank1" if target == "rank1" else dumps.get(target)
    if target == "cut":
        path = tmp_path / "cut"
        shutil.copytree(dumps["shard"], path)
        index = path / "rank1" / "index.jsonl"
        lines = index.read_text().splitlines(keepends=True)
        index.write_text("".join(x for x in lines if json.loads(x).get("token", 9) <= 1))
    assert path is not None
    for suffix in (".csv", ".json"):
        whole_run_report(dumps["golden"], path, tmp_path / f"whole{suffix}")
        code, windows = windowed_report(
            dumps["golden"], path, tmp_path / f"windowed{suffix}", monkeypatch
        )
        assert code in (0, 1) and windows >= 2
        assert (tmp_path / f"windowed{suffix}").read_bytes() == (
            tmp_path / f"whole{suffix}"
        ).read_bytes()
