"""Disk full / unwritable while dumping: one line on stderr, capture stops, the model finishes,
nothing already written is damaged. Real limits in real processes (RLIMIT_FSIZE: writes past the
limit fail with EFBIG, as on a full disk)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from layerwatch.capture import DumpConfig, register_hook
from layerwatch.capture.demo import build_model, generate
from layerwatch.capture.errors import LayerwatchError
from safetensors import safe_open
from support import lwdump, writers

CHILD = (
    writers.SELECT
    + """
import json, os, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # then a write past the limit fails with EFBIG
limit, at = int(sys.argv[2]), int(sys.argv[3])
select_writer(sys.argv[5])  # the writer in this process, in its own, or handed over to it
from layerwatch.capture import DumpConfig, register_hook
from layerwatch.capture.demo import build_model, generate
model = build_model(layers=4)
handle = register_hook(model, DumpConfig(dump_path=sys.argv[1], **json.loads(sys.argv[4])))

def fill_up(module, args, output):  # the disk fills up while dumping, at token `at`
    handle.flush()  # one batch per token, so what lands before the limit does not depend on timing
    if model.ctx.step == at:  # the limit of the process that writes (it ignores SIGXFSZ too)
        proc = getattr(handle._writer, "_proc", None)
        pid = 0 if proc is None else proc.pid
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, limit))

model.register_forward_hook(fill_up)
ids = generate(model, new_tokens=8)
handle.close()
print(" ".join(map(str, ids[0].tolist())))
print("failed:", handle.failed)
"""
)
CASES = {
    # the index crosses the limit in the middle of a batch's lines: the short write is undone
    "index-tensors": (150_000, 1, {"token_range": "1-"}),
    "index-stats-only": (60_000, 1, {"dump_statistics_mode": 1}),
    # a data file crosses the limit while the index still has room (it then gets an error line)
    "data": (
        5_000,
        3,
        {
            "token_range": "1-",
            "tensor_part": 1,
            "layer_name": ["root.output", "root.layers.0.attention.cache"],
        },
    ),
}


def _check_intact(run) -> list[dict]:
    """Every complete index line parses and every payload it points at is on disk and readable."""
    text = (run / "index.jsonl").read_text()
    assert text == "" or text.endswith("\n")
    lines = [json.loads(line) for line in text.splitlines()]
    for line in lines:
        if line["k"] == "t" and line["file"]:
            lwdump.load(run, line)
            with safe_open(str(run / line["file"]), "pt"):
                pass
    assert not list(run.rglob(".tmp-*"))
    json.loads((run / "manifest.json").read_text())
    return lines


@pytest.mark.parametrize("writer", writers.WRITERS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_file_size_limit_stops_capture_but_not_the_model(tmp_path, case, writer):
    limit, at, config = CASES[case]
    args = [str(tmp_path), str(limit), str(at), json.dumps(config), writer]
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    expected = generate(build_model(layers=4), new_tokens=8)[0].tolist()
    out = proc.stdout.splitlines()
    assert [int(x) for x in out[0].split()] == expected  # the model ran to the end, unchanged
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith(
        "layerwatch: capture stopped: file size limit reached"
    )
    assert out[1] == "failed: " + err[0].removeprefix("layerwatch: ")
    run = lwdump.rank_dir(tmp_path)
    lines = _check_intact(run)
    assert any(ln["k"] == "t" for ln in lines)  # what landed before the limit is still there
    assert not any(ln["k"] == "end" for ln in lines)  # and nobody claims the dump is complete
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] != "complete"
    if case == "data":
        assert "/data/" in err[0] and lines[-1]["k"] == "error"
        assert list((run / "data").iterdir())
    else:
        assert "index.jsonl" in err[0]


def test_unwritable_dump_path_is_a_one_line_error_before_anything_runs(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(LayerwatchError) as info:
        register_hook(build_model(layers=1), DumpConfig(dump_path=blocker / "dump"))
    assert "cannot write a dump" in str(info.value) and "\n" not in str(info.value)


def test_directory_lost_mid_run(tmp_path, capfd):
    model = build_model(layers=2)
    handle = register_hook(model, DumpConfig(dump_path=tmp_path))
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        model(ids, 0)
        assert handle.flush(timeout=60)
        before = _check_intact(handle.run_dir)
        files = sorted((handle.run_dir / "data").iterdir())
        saved = {p.name: p.read_bytes() for p in files}
        for p in files:  # move what landed aside, then make the data directory unusable
            shutil.move(p, tmp_path / p.name)
        (handle.run_dir / "data").rmdir()
        (handle.run_dir / "data").write_text("a file where the directory was")
        for step in range(1, 4):
            model(torch.tensor([[step]]), 2 + step)
    handle.close()
    err = [ln for ln in capfd.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("layerwatch: capture stopped:")
    assert handle.failed is not None and handle.tokens == 4
    for name, data in saved.items():  # nothing written before the failure was touched
        assert (tmp_path / name).read_bytes() == data
    after = [json.loads(x) for x in (handle.run_dir / "index.jsonl").read_text().splitlines()]
    assert after[: len(before)] == before
    assert after[-1]["k"] == "error" and "capture stopped" in after[-1]["message"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_permission_lost_mid_run(tmp_path, capfd):
    model = build_model(layers=2)
    handle = register_hook(model, DumpConfig(dump_path=tmp_path))
    with torch.no_grad():
        model(torch.tensor([[1, 2]]), 0)
        handle.flush(timeout=60)
        os.chmod(handle.run_dir / "data", 0o500)
        try:
            model(torch.tensor([[3]]), 2)
            handle.close()
        finally:
            os.chmod(handle.run_dir / "data", 0o700)
    err = [ln for ln in capfd.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "no permission to write" in err[0]
