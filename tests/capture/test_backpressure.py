"""A slow disk makes the model wait; it never lets copied-but-unwritten bytes grow past the bound."""

from __future__ import annotations

import time

import torch
from layerwatch.capture import DumpConfig, register_hook
from layerwatch.capture.writer import LayerwatchWriter
from layerwatch.capture.writer_process import ENV
from support import lwdump
from support.wide import Wide


def test_slow_writer_back_pressure_bounds_the_queue(tmp_path, monkeypatch):
    original = LayerwatchWriter.write_items
    delays = []

    def slow_write(self, items):  # a disk that needs 20 ms per batch
        time.sleep(0.02)
        delays.append(len(items))
        return original(self, items)

    monkeypatch.setattr(LayerwatchWriter, "write_items", slow_write)
    monkeypatch.setenv(ENV, "thread")  # the slow disk is this process's writer
    bound = 512 * 1024
    model = Wide()
    x = torch.randn(128, 128)  # 64 KiB activations
    with (
        torch.no_grad(),
        register_hook(
            model, DumpConfig(dump_path=tmp_path, queue_bytes=bound, dump_statistics_mode=0)
        ) as handle,
    ):
        start = time.perf_counter()
        for _ in range(12):
            model(x)
        produced = time.perf_counter() - start
        peak = handle.queue_peak_bytes
    total = 12 * (8 + 1) * 128 * 128 * 4  # every step: 9 distinct tensors of 64 KiB
    assert total > 10 * bound  # far more than the bound went through the queue
    assert 0 < peak <= bound
    assert len(delays) >= total / bound  # so the writer was handed many separate batches
    assert produced > 0.02 * (total / bound - 2)  # and the model did wait for it
    got = lwdump.tensors(handle.run_dir)
    assert {t for (t, _, _) in got} == set(range(12))
    last = lwdump.load(handle.run_dir, got[11, "root", "output"])
    assert torch.equal(last, model(x).detach())
