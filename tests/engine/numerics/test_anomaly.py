"""The per-tensor anomaly checks, edge by edge (engine/numerics/anomaly.py)."""

from __future__ import annotations

import math

import pytest
from layerwatch.engine.numerics import anomaly
from layerwatch.engine.records import Stats

CLEAN = Stats(max=2.0, min=-3.0, mean=0.1, norm=10.0)
NAN = math.nan


@pytest.mark.parametrize(
    "stats, dtype, kinds",
    [
        (CLEAN, "float16", []),
        (Stats(2.0, -3.0, 0.0, 1.0, nan=4), "float16", ["nan"]),
        (Stats(2.0, -3.0, 0.0, 1.0, inf=1), "bfloat16", ["inf"]),
        (Stats(NAN, NAN, NAN, 0.0, nan=3, inf=2), "float32", ["nan", "inf"]),  # no finite element
        (Stats(65504.0, 0.0, 1.0, 1.0), "float16", ["saturated"]),
        (Stats(1.0, -65504.0, 1.0, 1.0), "float16", []),  # finfo.min: masked scores
        (Stats(65504.0, 0.0, 1.0, 1.0), "float32", []),  # fp16's max is ordinary in fp32
        (Stats(3.3895313892515355e38, 0.0, 1.0, 1.0), "bfloat16", ["saturated"]),
        (Stats(100.0, 0.0, 1.0, 1.0, nan=1), "int64", []),  # integers are not judged
        (Stats(0.0, -65504.0, -9e3, 1.0), "float16", []),  # an additive attention mask
        (Stats(0.0, -3.4028234663852886e38, -1e38, 1.0), "float32", []),
        (Stats(65504.0, -65504.0, -9e3, 1.0), "float16", ["saturated"]),
    ],
)
def test_own_kinds(stats: Stats, dtype: str, kinds: list[str]) -> None:
    assert anomaly.own_kinds(stats, dtype) == kinds


ZERO = Stats(0.0, 0.0, 0.0, 0.0)


def test_all_zero_needs_non_zero_inputs() -> None:
    assert anomaly.output_kinds(ZERO, "float16", [CLEAN]) == ["zero"]
    assert anomaly.output_kinds(ZERO, "float16", [ZERO]) == []  # zeros in, zeros out
    assert anomaly.output_kinds(ZERO, "float16", []) == []  # inputs unknown: not judged


def test_a_mask_value_counts_for_no_magnitude() -> None:
    masked_scores = Stats(0.04, -3.4028234663852886e38, -1e37, 1.0)
    assert anomaly.magnitude(masked_scores) == 0.04
    assert anomaly.output_kinds(masked_scores, "float32", [Stats(0.1, -0.1, 0, 1)]) == []


def test_jump_needs_both_the_ratio_and_the_floor() -> None:
    big = Stats(5000.0, -1.0, 0.0, 1.0)
    assert anomaly.output_kinds(big, "bfloat16", [Stats(4.0, -4.0, 0.0, 1.0)]) == ["jump"]
    assert anomaly.output_kinds(big, "bfloat16", [Stats(6.0, -6.0, 0.0, 1.0)]) == []  # 833×
    norm_of_tiny = Stats(3.0, -3.0, 0.0, 1.0)  # a norm of a 1e-5 residual: ratio 3e5, small
    assert anomaly.output_kinds(norm_of_tiny, "float16", [Stats(1e-5, -1e-5, 0, 1)]) == []
    tight = anomaly.Bounds(ratio=10.0, floor=1.0)
    assert anomaly.output_kinds(norm_of_tiny, "float16", [Stats(0.1, 0, 0, 1)], tight) == ["jump"]
    assert anomaly.ratio(big, [ZERO]) == math.inf and anomaly.ratio(big, []) is None


@pytest.mark.parametrize(
    "out, inputs, explained",
    [
        (["nan"], {"nan"}, True),
        (["nan"], {"inf"}, True),  # inf - inf
        (["saturated"], {"saturated"}, True),
        (["inf"], {"saturated"}, True),
        (["nan"], {"saturated"}, False),  # a NaN is born here even from a saturated input
        (["zero"], set(), False),
        ([], {"nan"}, False),
    ],
)
def test_what_an_input_explains(out: list[str], inputs: set[str], explained: bool) -> None:
    assert anomaly.carries(out, inputs) is explained
