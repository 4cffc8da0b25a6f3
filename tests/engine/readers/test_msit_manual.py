"""msit's manual dump (``golden_tensor/metadata.json``): golden ``.pth`` files and the target's
ATB ``.bin`` files named in one metadata file, compared with ``layerwatch compare DIR DIR``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from layerwatch.engine.readers import detect, open_dump
from support.atb import write_bin

TOKENS = 3
IDS = ("0", "1", "2")


def _manual_dump(root: Path, broken: tuple[str, int] | None = None) -> Path:
    """The layout msit's ``dump_data`` writes, with its duplicate keys, and ATB targets."""
    rank = root / "msit_dump_20250101000000" / "1234_-1"
    gold = rank / "golden_tensor"
    rng = np.random.default_rng(0)
    entries = []
    for data_id in IDS:
        for token in range(TOKENS):
            value = rng.standard_normal((2, 8)).astype(np.float32)
            golden = gold / str(token) / f"{data_id}_tensor.pth"
            golden.parent.mkdir(parents=True, exist_ok=True)
            torch.save(torch.from_numpy(value), golden)
            mine = value * (1.5 if (data_id, token) == broken else 1.0)
            target = write_bin(root / "atb" / str(token) / f"{data_id}_outtensor0.bin", mine)
            entries.append((data_id, token, str(golden), str(target)))
    # msit re-dumps the whole dict after each call; after a reload ids are str, new ones int:
    # "0" appears as a str key and again as an int key (duplicate JSON keys).
    parts = []
    for data_id in IDS:
        tokens = {str(t): [g, m] for d, t, g, m in entries if d == data_id}
        parts.append(f'"{data_id}": {json.dumps(tokens)}')
    parts.append(f'"{IDS[0]}": ' + json.dumps({"0": [entries[0][2], entries[0][3]]}))
    (gold / "metadata.json").write_text("{" + ", ".join(parts) + "}")
    return root / "msit_dump_20250101000000"


def test_both_sides_come_from_one_metadata_file(tmp_path: Path) -> None:
    run = _manual_dump(tmp_path)
    assert detect(run) == "msit-manual"
    golden = open_dump(run, side="golden").poll(None, final=True)
    target = open_dump(run, side="target").poll(None, final=True)
    assert len(golden.tensors) == len(target.tensors) == len(IDS) * TOKENS
    assert {r.key for r in golden.tensors} == {r.key for r in target.tensors}
    assert {r.source.endswith(".pth") for r in golden.tensors} == {True}
    assert {r.source.endswith(".bin") for r in target.tensors} == {True}
    assert golden.notes == [] and target.notes == []


def test_compare_finds_the_broken_point(tmp_path: Path) -> None:
    run = _manual_dump(tmp_path, broken=("1", 2))
    out = subprocess.run(
        [sys.executable, "-m", "layerwatch.tui.cli", "compare", str(run), str(run), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    assert (report["first_failure"]["token"], report["first_failure"]["node"]) == (2, "root.1")
    verdicts = {(r["token"], r["node"]): r["verdict"] for r in report["rows"]}
    assert len(verdicts) == len(IDS) * TOKENS
    assert [k for k, v in verdicts.items() if v != "pass"] == [(2, "root.1")]


def test_malformed_metadata_is_one_line(tmp_path: Path) -> None:
    gold = tmp_path / "golden_tensor"
    gold.mkdir()
    (gold / "metadata.json").write_text('{"0": {"0": "not a pair"}}')
    out = subprocess.run(
        [sys.executable, "-m", "layerwatch.tui.cli", "compare", str(gold), str(gold)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "expected [golden_path, my_path]" in out.stderr.strip().splitlines()[-1]


def _compare_json(run: Path) -> tuple[int, dict, str]:
    out = subprocess.run(
        [sys.executable, "-m", "layerwatch.tui.cli", "compare", str(run), str(run), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return out.returncode, json.loads(out.stdout or "null"), out.stderr


def test_metadata_cut_short_pairs_the_points_before_the_cut(tmp_path: Path) -> None:
    """msit rewrites metadata.json at each point; one a killed run left cut short still pairs
    every data id written whole before the cut (rows as the uncut file's), with a note; a
    corrupt one stays one line, exit 2."""
    run = _manual_dump(tmp_path, broken=("0", 1))
    code, whole, _ = _compare_json(run)
    assert code == 1
    meta = next(run.rglob("metadata.json"))
    text = meta.read_text()
    at = text.index('"2": {') + 10  # inside the third data id
    meta.write_text(text[:at])
    code, cut, err = _compare_json(run)
    assert code == 1 and "Traceback" not in err, err
    assert f"{meta}: cut short at character {at}, after 2 complete data ids" in err
    rows = {(r["token"], r["node"]): r for r in cut["rows"]}
    assert sorted({node for _, node in rows}) == ["root.0", "root.1"]
    for row in (r for r in whole["rows"] if r["node"] != "root.2"):
        got = rows[(row["token"], row["node"])]
        assert got["verdict"] == row["verdict"]
        # the last point of a dump is judged as logits too (engine/session): its extra metrics
        assert row["metrics"].items() <= got["metrics"].items()
    meta.write_text(text[: at - 4] + "#" + text[at - 3 : at])
    code, _, err = _compare_json(run)
    assert code == 2 and "not msit manual-dump metadata" in err.strip().splitlines()[-1]
