"""Statistics-first capture (``DumpConfig(keep_tokens=N)``): statistics of every tensor,
payloads only for the last N tokens and around an anomaly, on a real tiny Llama."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from layerwatch.capture import DumpConfig, register_hook
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.readers import open_dump
from layerwatch.engine.scan import scan_dump
from support import lwdump, tiny_hf

pytest.importorskip("transformers")
STEPS = 12
KEEP = 3
NAN_AT = 5


def _run(out: Path, keep: int | None, nan_at: int | None = NAN_AT) -> Path:
    model = tiny_hf.build("llama", torch.float16)
    calls = []

    def nan_once(module, args, output):  # registered first: capture sees the NaN
        calls.append(1)
        return output * float("nan") if len(calls) - 1 == nan_at else output

    model.model.layers[1].mlp.act_fn.register_forward_hook(nan_once)
    ids = tiny_hf.prompt()
    with register_hook(model, DumpConfig(dump_path=out, keep_tokens=keep)) as h, torch.no_grad():
        for _ in range(STEPS):
            model(ids)
            h.flush()  # one token per data file
    return h.run_dir


def test_payloads_of_the_ring_and_around_the_anomaly_stay(tmp_path: Path) -> None:
    run = _run(tmp_path, KEEP)
    lines = lwdump.index(run)
    tensors = [ln for ln in lines if ln["k"] == "t"]
    assert {ln["token"] for ln in tensors} == set(range(STEPS))
    assert all(ln["stats"] is not None for ln in tensors)  # statistics of everything
    dropped = {ln["file"] for ln in lines if ln["k"] == "drop"}
    on_disk = {ln["token"] for ln in tensors if ln["file"] and ln["file"] not in dropped}
    expected = {NAN_AT - 1, NAN_AT, NAN_AT + 1} | set(range(STEPS - KEEP, STEPS))
    assert on_disk == expected
    assert all(not (run / f).exists() for f in dropped)
    assert all((run / ln["file"]).exists() for ln in tensors if ln["token"] in expected)

    records = open_dump(run).poll(None, final=True).tensors
    by_token = {r.key.token: r for r in records if r.key.stem == "output"}
    assert by_token[0].loc is None and by_token[0].stats is not None
    assert by_token[NAN_AT].loc is not None
    first = scan_dump(str(run)).first_failure  # the scan needs statistics only
    assert first is not None and (first.key.token, first.key.node) == (
        NAN_AT,
        "root.model.layers.1.mlp.act_fn",
    )


def test_statistics_only_pairs_compare(tmp_path: Path) -> None:
    golden = _run(tmp_path / "g", KEEP, nan_at=None)
    target = _run(tmp_path / "t", None, nan_at=None)
    out = subprocess.run(
        [sys.executable, "-m", "layerwatch.tui.cli", "compare", str(golden), str(target), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr
    rows = json.loads(out.stdout)["rows"]
    old = [r for r in rows if r["token"] == 0 and r["node"] == "root.lm_head"]
    assert old and "max_stat_relative_error" in old[0]["metrics"]
    new = [r for r in rows if r["token"] == STEPS - 1 and r["node"] == "root.lm_head"]
    assert new and "cosine_similarity" in new[0]["metrics"]


def test_bad_settings_are_one_line() -> None:
    with pytest.raises(LayerwatchError, match="keep_tokens must be"):
        DumpConfig(keep_tokens=0)
    with pytest.raises(LayerwatchError, match="needs the layerwatch format"):
        DumpConfig(keep_tokens=2, dump_statistics_mode=1)


@pytest.mark.parametrize("suffix", [".csv", ".json"])
def test_compared_in_windows_the_report_is_the_whole_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    """Dropped data files are known from the index's columns before any window, so a
    statistics-first dump is compared a window of tokens at a time (pairs of dropped payloads
    judged by their statistics) and writes the report the whole read gives, byte for byte."""
    from support.scale import whole_run_report, windowed_report

    golden = _run(tmp_path / "g", KEEP, nan_at=None)
    target = _run(tmp_path / "t", KEEP)
    whole_run_report(golden, target, tmp_path / f"whole{suffix}")
    code, windows = windowed_report(golden, target, tmp_path / f"windowed{suffix}", monkeypatch)
    assert code == 1 and windows >= 2
    assert (tmp_path / f"windowed{suffix}").read_bytes() == (
        tmp_path / f"whole{suffix}"
    ).read_bytes()
