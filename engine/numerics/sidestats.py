"""Statistics of one side of a pair (max, min, mean, L2 norm over its finite elements), gathered
by the metric pass when a record carries none (msit ``.pth`` dumps): what msit's CSV columns
``golden_max_value`` … ``my_mean_value`` show, without a second read of the tensor."""

from __future__ import annotations

import math

import numpy as np
from layerwatch.engine.records import Stats


class SideStats:
    """Running max/min/Σx/Σx²/count of the finite elements of one side (float64)."""

    __slots__ = ("count", "high", "low", "sq", "total")

    def __init__(self) -> None:
        self.high = -math.inf
        self.low = math.inf
        self.total = 0.0
        self.sq = 0.0
        self.count = 0

    def add(self, values: np.ndarray, sq: float) -> None:
        """Finite float64 ``values`` whose squares sum to ``sq`` (the caller has it already)."""
        if values.size:
            self.high = max(self.high, float(values.max()))
            self.low = min(self.low, float(values.min()))
            self.total += float(values.sum())
            self.sq += sq
            self.count += values.size

    def add_sums(self, high: float, low: float, total: float, sq: float, count: int) -> None:
        if count:
            self.high = max(self.high, high)
            self.low = min(self.low, low)
            self.total += total
            self.sq += sq
            self.count += count

    def stats(self, nan: int, inf: int) -> Stats:
        """Like ``compare.tensor_stats``: NaN for max/min/mean when nothing is finite."""
        if not self.count:
            return Stats(math.nan, math.nan, math.nan, 0.0, nan, inf)
        return Stats(self.high, self.low, self.total / self.count, math.sqrt(self.sq), nan, inf)
