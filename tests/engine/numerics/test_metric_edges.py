"""Metric edge cases, each run on numpy arrays and on torch tensors (Polygraphy style)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.numerics.arrays import compare_arrays
from layerwatch.engine.numerics.thresholds import Thresholds
from layerwatch.engine.records import (
    COSINE,
    EXACT,
    FIVE_THOUSANDTHS,
    INF_GOLDEN,
    INF_TARGET,
    MAX_ABS,
    MAX_REL,
    MEAN_ABS,
    MEAN_REL,
    NAN_GOLDEN,
    NAN_MISMATCH,
    NAN_TARGET,
    NORM_REL,
    ONE_THOUSANDTH,
    RED,
    Verdict,
)

ARRAY_TYPES = pytest.mark.parametrize(
    "array_type", [np.asarray, torch.as_tensor], ids=["numpy", "torch"]
)
RNG = np.random.default_rng(7)
BASE = RNG.standard_normal((8, 64)).astype(np.float32)


def judge(metrics: dict[str, float], g_dtype: str = "float32", t_dtype: str = "float32"):
    return Thresholds.load().judge(
        metrics, node="root.layer", golden_dtype=g_dtype, target_dtype=t_dtype
    )


@ARRAY_TYPES
def test_identical_is_perfect(array_type) -> None:
    m = compare_arrays(array_type(BASE), array_type(BASE.copy()))
    assert m[COSINE] == 1.0
    assert m[RED] == m[MAX_ABS] == m[MEAN_ABS] == m[MAX_REL] == m[MEAN_REL] == 0.0
    assert m[ONE_THOUSANDTH] == m[FIVE_THOUSANDTHS] == 1.0
    assert m[NAN_MISMATCH] == 0.0
    assert judge(m)[0] is Verdict.PASS


@ARRAY_TYPES
def test_both_zero_is_perfect(array_type) -> None:
    zero = np.zeros((3, 5), np.float32)
    m = compare_arrays(array_type(zero), array_type(zero.copy()))
    assert (m[COSINE], m[RED], m[MAX_ABS], m[MAX_REL]) == (1.0, 0.0, 0.0, 0.0)
    assert judge(m)[0] is Verdict.PASS


@ARRAY_TYPES
def test_golden_zero_target_nonzero_shows_large_errors(array_type) -> None:
    """msit reports 0 for every error here (|golden| ≤ eps masked); we must not."""
    target = np.abs(BASE) + 0.5
    m = compare_arrays(array_type(np.zeros_like(BASE)), array_type(target))
    assert m[COSINE] == 0.0
    assert m[RED] == math.inf
    assert m[MAX_ABS] == pytest.approx(float(target.max()))
    assert m[MEAN_ABS] == pytest.approx(float(target.mean()), rel=1e-6)
    assert m[MAX_REL] > 1e5 and m[MEAN_REL] > 1e5
    assert m[ONE_THOUSANDTH] == 0.0
    verdict, failed, reason = judge(m)
    assert verdict is Verdict.FAIL
    assert {COSINE, RED} <= set(failed)
    assert "cosine 0 < 0.99999" in reason


@ARRAY_TYPES
def test_target_zero_golden_nonzero(array_type) -> None:
    m = compare_arrays(array_type(BASE), array_type(np.zeros_like(BASE)))
    assert m[COSINE] == 0.0
    assert m[RED] == pytest.approx(1.0)
    assert m[MAX_REL] == pytest.approx(1.0)


@ARRAY_TYPES
def test_scale_error_is_caught_by_red_not_cosine(array_type) -> None:
    m = compare_arrays(array_type(BASE), array_type(BASE * 2))
    assert m[COSINE] == pytest.approx(1.0, abs=1e-12)
    assert m[RED] == pytest.approx(1.0, rel=1e-12)
    assert m[NORM_REL] == pytest.approx(1.0, rel=1e-12)
    verdict, failed, reason = judge(m)
    assert verdict is Verdict.FAIL and failed == ("relative_euclidean_distance",)
    assert reason.startswith("relative_euclidean_distance 1 > ")
    assert reason.endswith("(float32 limits)")


@ARRAY_TYPES
def test_negated(array_type) -> None:
    m = compare_arrays(array_type(BASE), array_type(-BASE))
    assert m[COSINE] == pytest.approx(-1.0, abs=1e-12)
    assert m[RED] == pytest.approx(2.0)
    assert m[MAX_REL] == pytest.approx(2.0)


@ARRAY_TYPES
def test_nan_inf_at_equal_positions_compare_the_finite_rest(array_type) -> None:
    golden = BASE.copy()
    golden[1, 2], golden[3, 4], golden[5, 6] = np.nan, np.inf, -np.inf
    target = golden.copy()
    target[0, 0] += 1e-3
    m = compare_arrays(array_type(golden), array_type(target))
    assert m[NAN_MISMATCH] == 0.0
    assert (m[NAN_GOLDEN], m[NAN_TARGET], m[INF_GOLDEN], m[INF_TARGET]) == (1, 1, 2, 2)
    assert math.isfinite(m[COSINE]) and m[COSINE] > 0.99999
    assert m[MAX_ABS] == pytest.approx(1e-3, rel=1e-3)
    assert judge(m)[0] is Verdict.PASS


@ARRAY_TYPES
def test_nan_inf_at_different_positions(array_type) -> None:
    golden = BASE.copy()
    target = BASE.copy()
    golden[0, 1] = np.nan
    target[0, 2] = np.nan
    golden[2, 2] = np.inf
    target[2, 2] = -np.inf  # same position, different class
    m = compare_arrays(array_type(golden), array_type(target))
    assert m[NAN_MISMATCH] == 3.0
    assert m[COSINE] == 1.0  # the positions finite on both sides are identical
    verdict, failed, _ = judge(m)
    assert verdict is Verdict.FAIL and failed == ("nonfinite_mismatch",)


@ARRAY_TYPES
def test_nan_in_target_only_fails_with_reason(array_type) -> None:
    target = BASE.copy()
    target[4, 4] = np.nan
    target[4, 5] = np.inf
    m = compare_arrays(array_type(BASE), array_type(target))
    verdict, failed, reason = judge(m)
    assert verdict is Verdict.FAIL and "nonfinite_mismatch" in failed
    assert "target has 1 NaN and 1 Inf where golden is finite" in reason


@ARRAY_TYPES
def test_empty_is_vacuously_equal(array_type) -> None:
    empty = np.zeros((0, 4), np.float32)
    m = compare_arrays(array_type(empty), array_type(empty.copy()))
    assert m[COSINE] == 1.0 and m[RED] == 0.0 and m[NAN_MISMATCH] == 0.0
    assert judge(m)[0] is Verdict.PASS


@ARRAY_TYPES
def test_zero_dimensional(array_type) -> None:
    m = compare_arrays(array_type(np.float32(2.0)), array_type(np.float32(3.0)))
    assert m[MAX_ABS] == 1.0 and m[MAX_REL] == 0.5 and m[RED] == 0.5
    assert judge(m)[0] is Verdict.FAIL


@ARRAY_TYPES
def test_bool_tensors_report_exact_match_share(array_type) -> None:
    golden = np.array([True, False, True, True])
    target = np.array([True, True, True, True])
    m = compare_arrays(array_type(golden), array_type(target))
    assert m[EXACT] == 0.75
    assert m[MAX_ABS] == 1.0 and m[MEAN_ABS] == 0.25
    verdict, failed, reason = judge(m, "bool", "bool")
    assert verdict is Verdict.FAIL and failed == (EXACT,)
    assert "(integer limits)" in reason
    same = compare_arrays(array_type(golden), array_type(golden.copy()))
    assert same[EXACT] == 1.0 and judge(same, "bool", "bool")[0] is Verdict.PASS


@ARRAY_TYPES
def test_int_tensors_compare_exactly(array_type) -> None:
    golden = np.arange(10, dtype=np.int64) + (1 << 40)
    target = golden.copy()
    target[3] += 1
    m = compare_arrays(array_type(golden), array_type(target))
    assert m[EXACT] == 0.9
    assert m[MAX_ABS] == 1.0
    assert judge(m, "int64", "int64")[0] is Verdict.FAIL
    assert (
        judge(compare_arrays(array_type(golden), array_type(golden)), "int64", "int64")[0]
        is Verdict.PASS
    )


@ARRAY_TYPES
def test_fp16_target_against_fp32_golden(array_type) -> None:
    m = compare_arrays(array_type(BASE), array_type(BASE.astype(np.float16)))
    assert 0.999999 < m[COSINE] < 1.0
    assert 0 < m[RED] < 1e-3
    assert judge(m, "float32", "float16")[0] is Verdict.PASS


def test_bf16_target_against_fp32_golden() -> None:
    golden = torch.as_tensor(BASE)
    m = compare_arrays(golden, golden.bfloat16())
    assert 0.99999 < m[COSINE] < 1.0
    assert 1e-3 < m[RED] < 4e-3  # bf16 rounding: ≈ 2^-9 relative RMS
    assert m[MAX_REL] < 2**-8 + 1e-6
    assert judge(m, "float32", "bfloat16")[0] is Verdict.PASS


def test_shape_mismatch_raises_in_compare_arrays() -> None:
    with pytest.raises(
        LayerwatchError, match=r"shape mismatch: golden \[2, 3\] vs target \[3, 2\]"
    ):
        compare_arrays(np.zeros((2, 3)), np.zeros((3, 2)))


def test_cosine_keeps_its_digits_near_one() -> None:
    """1 − cos from the difference norm: an orthogonal ε = 1e-7 gives 1 − cos = 5e-15."""
    n = 1000
    golden = np.zeros(n)
    golden[0] = 1.0
    target = golden.copy()
    target[1] = 1e-7
    m = compare_arrays(golden, target)
    assert 1.0 - m[COSINE] == pytest.approx(5e-15, rel=1e-3)
    # 0.9999 and 0.99999 resolve and are judged apart.
    for one_minus, passes in ((1e-4, False), (1e-6, True)):
        eps = math.sqrt(2 * one_minus)
        t = golden.copy()
        t[1] = eps
        cos = compare_arrays(golden, t)[COSINE]
        assert 1.0 - cos == pytest.approx(1.0 - 1.0 / math.sqrt(1.0 + eps * eps), rel=1e-9)
        verdict, _, reason = judge({COSINE: cos})
        assert (verdict is Verdict.PASS) is passes
        if not passes:
            assert reason.startswith("cosine 0.9999 < 0.99999")


def test_cosine_of_norms_orders_of_magnitude_apart() -> None:
    """fp32 vs fp16 additive attention masks: −3.4e38 against −65504 at the same positions."""
    golden = np.zeros((4, 4), np.float32)
    golden[np.triu_indices(4, 1)] = np.finfo(np.float32).min
    target = np.where(golden < 0, np.float32(np.finfo(np.float16).min), np.float32(0))
    m = compare_arrays(golden, target)
    assert m[COSINE] == pytest.approx(1.0, abs=1e-12)
    assert m[RED] == pytest.approx(1.0, rel=1e-6)
    flipped = compare_arrays(golden, golden.T.copy())
    assert flipped[COSINE] == pytest.approx(0.0, abs=1e-12)


def test_torch_inputs_need_no_grad_or_cpu_copy_by_caller() -> None:
    golden = torch.as_tensor(BASE).requires_grad_(True)
    target = (golden * 1.0).detach()
    assert compare_arrays(golden * 1.0, target)[COSINE] == 1.0


@ARRAY_TYPES
def test_identical_payloads_with_nan_take_the_fast_path_and_still_count(array_type) -> None:
    golden = BASE.copy()
    golden[2, 3], golden[6, 1] = np.nan, -np.inf
    m = compare_arrays(array_type(golden), array_type(golden.copy()))
    assert (m[NAN_GOLDEN], m[NAN_TARGET], m[INF_GOLDEN], m[INF_TARGET], m[NAN_MISMATCH]) == (
        1,
        1,
        1,
        1,
        0,
    )
    assert m[COSINE] == 1.0 and m[RED] == 0.0 and m[ONE_THOUSANDTH] == 1.0
    assert judge(m)[0] is Verdict.PASS


def test_compare_path_imports_neither_torch_nor_pandas() -> None:
    import subprocess
    import sys

    code = (
        "import sys, layerwatch.engine.numerics.compare, layerwatch.engine.numerics.explain, layerwatch.engine.numerics.metrics;"
        "print(sorted(m for m in ('torch', 'pandas') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
