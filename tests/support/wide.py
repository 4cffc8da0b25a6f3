"""A host model whose every step emits 9 distinct tensors of 64 KiB: fills a byte-bounded
queue fast (tests/capture/test_backpressure.py, test_writer_process.py)."""

from __future__ import annotations

from torch import nn


class Wide(nn.Module):
    """Each step emits ~64 KiB per module call through 8 modules."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(128, 128) for _ in range(8))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x
