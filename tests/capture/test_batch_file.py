"""The small-tensor write path: many tensors a batch file, small payloads joined into one buffer,
header and index lines formatted as text. Offsets, names and bytes must stay exact; a write cut
in the middle of a batch must leave what was written before it whole."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from layerwatch.capture import DumpConfig, register_hook
from layerwatch.capture.safetensors_file import JOIN_BELOW
from safetensors import safe_open
from support import lwdump, writers
from torch import nn


class Emit(nn.Module):
    def forward(self, x):
        return x


class Fan(nn.Module):
    """Emits each tensor it is given through its own child (names with JSON-special characters)."""

    def __init__(self, names: list[str]) -> None:
        super().__init__()
        self.kids = nn.ModuleDict({n: Emit() for n in names})

    def forward(self, xs):
        return [kid(x) for kid, x in zip(self.kids.values(), xs, strict=True)]


def _mixed() -> list[torch.Tensor]:
    """Small payloads of every width around one that is written from its own memory."""
    gen = torch.Generator().manual_seed(0)
    big = torch.randn(JOIN_BELOW // 4 + 3, generator=gen)  # just over the join limit
    return [
        torch.randn(5, 7, generator=gen),
        torch.randn(3, generator=gen).half(),
        torch.randn(9, generator=gen).to(torch.bfloat16),
        torch.tensor([True, False, True]),
        torch.arange(11, dtype=torch.int64),
        torch.tensor(2.5),  # 0-d
        torch.zeros(0, 4),  # empty
        big,
        torch.randn(2, 3, generator=gen).double(),
        torch.arange(7, dtype=torch.int8),
    ]


def test_small_payloads_share_a_buffer_and_every_offset_stays_exact(tmp_path):
    xs = _mixed()
    names = [f"k{i}" for i in range(len(xs))]
    names[1], names[2] = 'quo"te\\back', "ünïcode"
    fan = Fan(names)
    with register_hook(fan, DumpConfig(dump_path=tmp_path, tensor_part=1)) as handle:
        fan(xs)
    run = handle.run_dir
    got = lwdump.tensors(run)
    files = {got[0, f"root.kids.{n}", "output"]["file"] for n in names}
    assert len(files) == 1, "one token's tensors go to one batch file"
    path = run / files.pop()
    with open(path, "rb") as fh:
        (header_len,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(header_len))
    with safe_open(str(path), "pt") as st:
        for name, x in zip(names, xs, strict=True):
            line = got[0, f"root.kids.{name}", "output"]
            assert line["dtype"] == str(x.dtype).removeprefix("torch.")
            assert line["shape"] == list(x.shape)
            on_disk = lwdump.load(run, line)
            assert on_disk.dtype == x.dtype and torch.equal(on_disk, x), name
            entry = header[f"0/root.kids.{name}/output"]
            assert [line["begin"], line["end"]] == [
                8 + header_len + o for o in entry["data_offsets"]
            ]
            assert torch.equal(st.get_tensor(f"0/root.kids.{name}/output"), x), name
    # aliases (the list the root returns holds the same objects) point at the same bytes
    for i, name in enumerate(names):
        alias = got[0, "root", f"output_{i}"]
        line = got[0, f"root.kids.{name}", "output"]
        assert (alias["file"], alias["begin"], alias["end"], alias["stats"]) == (
            line["file"],
            line["begin"],
            line["end"],
            line["stats"],
        )


CHILD = (
    writers.SELECT
    + """
import resource, signal, sys, torch
from torch import nn
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
select_writer(sys.argv[2])  # the writer in this process, in its own, or handed over to it
from layerwatch.capture import DumpConfig, register_hook

class Emit(nn.Module):
    def forward(self, x):
        return x * 1.0

class Many(nn.Module):
    def __init__(self):
        super().__init__()
        self.kids = nn.ModuleList(Emit() for _ in range(100))
    def forward(self, x):
        for kid in self.kids:
            x = kid(x)
        return x

model = Many()
handle = register_hook(model, DumpConfig(dump_path=sys.argv[1], tensor_part=1))
x = torch.randn(1024)  # 4 KiB: joined, 400 KiB a batch file
for token in range(6):
    if token == 4:  # the disk fills up in the payloads of the 5th batch file (the index has room)
        proc = getattr(handle._writer, "_proc", None)  # the process that writes
        resource.prlimit(0 if proc is None else proc.pid, resource.RLIMIT_FSIZE, (200_000, 200_000))
    model(x)
    handle.flush()  # one batch file per token
handle.close()
print("failed:", handle.failed)
"""
)


@pytest.mark.parametrize("writer", writers.WRITERS)
def test_a_write_cut_in_the_middle_of_a_batch_leaves_earlier_batches_whole(tmp_path, writer):
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), writer],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "failed: capture stopped: file size limit reached" in proc.stdout, proc.stdout
    run = lwdump.rank_dir(tmp_path)
    assert not list(run.rglob(".tmp-*")), "the cut file's temp name is removed"
    lines = lwdump.index(run)
    tensors = [ln for ln in lines if ln["k"] == "t"]
    tokens = sorted({ln["token"] for ln in tensors})
    assert tokens == [0, 1, 2, 3], "the batches before the cut are listed, the cut one is not"
    for token in tokens:  # every tensor of every listed token is there and reads back exactly
        mine = [ln for ln in tensors if ln["token"] == token]
        assert len(mine) == 101
        values = {ln["node"]: lwdump.load(run, ln) for ln in mine}
        for i in range(100):
            assert torch.equal(values[f"root.kids.{i}"], values["root.kids.0"])
    assert any(ln["k"] == "error" for ln in lines)
    assert json.loads((run / "manifest.json").read_text())["status"].startswith("error")


def test_lines_land_within_the_flush_interval_without_a_flush(tmp_path):
    """The model thread does not wake the writer at every token; its own timer writes them."""
    emit = Emit()
    handle = register_hook(emit, DumpConfig(dump_path=tmp_path, flush_interval=0.05))
    try:
        emit(torch.ones(3))
        index = handle.run_dir / "index.jsonl"
        deadline = time.monotonic() + 10.0  # generous: a loaded CI box; typically ~0.05 s
        while b'"k":"t"' not in index.read_bytes():
            assert time.monotonic() < deadline, "the token's lines were never written"
            time.sleep(0.005)
        line = next(ln for ln in lwdump.index(handle.run_dir) if ln["k"] == "t")
        assert np.array_equal(lwdump.load(handle.run_dir, line).numpy(), np.ones(3))
    finally:
        handle.close()
