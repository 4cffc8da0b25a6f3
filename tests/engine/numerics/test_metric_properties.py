"""The streaming accumulator equals a plain one-shot float64 reference, for any chunking."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from layerwatch.engine import records as m
from layerwatch.engine.numerics.metrics import MetricAccumulator, paired_chunks

FLOOR = 1e-6


def reference(golden: np.ndarray, target: np.ndarray, floor: float) -> dict[str, float]:
    """The definitions, written the obvious way on whole float64 arrays."""
    g = golden.astype(np.float64).ravel()
    t = target.astype(np.float64).ravel()

    def kind(x: np.ndarray) -> np.ndarray:
        return np.select([np.isnan(x), x == np.inf, x == -np.inf], [1, 2, 3], 0)

    both = np.isfinite(g) & np.isfinite(t)
    out = {
        m.NAN_MISMATCH: float(np.sum(kind(g) != kind(t))),
        m.NAN_GOLDEN: float(np.isnan(g).sum()),
        m.NAN_TARGET: float(np.isnan(t).sum()),
        m.INF_GOLDEN: float(np.isinf(g).sum()),
        m.INF_TARGET: float(np.isinf(t).sum()),
    }
    g, t = g[both], t[both]
    ng, nt = np.linalg.norm(g), np.linalg.norm(t)
    if ng == 0 and nt == 0:
        cos = 1.0
    elif ng == 0 or nt == 0:
        cos = 0.0
    else:
        cos = float(np.dot(g, t) / (ng * nt))
    d = np.abs(t - g)
    rel = d / np.maximum(np.abs(g), floor)
    nd = np.linalg.norm(t - g)
    n = g.size
    out |= {
        m.COSINE: cos,
        m.RED: float(nd / ng) if ng else (math.inf if nd else 0.0),
        m.NORM_REL: float(abs(nt - ng) / ng) if ng else (math.inf if nt else 0.0),
        m.MAX_ABS: float(d.max()) if n else 0.0,
        m.MEAN_ABS: float(d.mean()) if n else 0.0,
        m.MAX_REL: float(rel.max()) if n else 0.0,
        m.MEAN_REL: float(rel.mean()) if n else 0.0,
        m.ONE_THOUSANDTH: float(np.mean(rel < 1e-3)) if n else 1.0,
        m.FIVE_THOUSANDTHS: float(np.mean(rel < 5e-3)) if n else 1.0,
    }
    return out


def streamed(golden, target, cuts_g, cuts_t, block) -> dict[str, float]:
    acc = MetricAccumulator(FLOOR, block=block)
    chunks_g = np.split(golden.ravel(), sorted(cuts_g))
    chunks_t = np.split(target.ravel(), sorted(cuts_t))
    for g, t in paired_chunks(chunks_g, chunks_t):
        acc.update(g, t)
    return acc.result()


def assert_close(got: dict[str, float], want: dict[str, float]) -> None:
    for name, value in want.items():
        if name in (m.COSINE, m.NORM_REL):  # absolute precision ~1e-16 near 1 / near 0
            assert math.isclose(got[name], value, rel_tol=0, abs_tol=1e-12), (
                name,
                got[name],
                value,
            )
        elif math.isinf(value):
            assert got[name] == value, name
        else:
            assert math.isclose(got[name], value, rel_tol=1e-9, abs_tol=1e-300), (
                name,
                got[name],
                value,
            )


@st.composite
def pairs(draw):
    n = draw(st.integers(0, 300))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    dtype = draw(st.sampled_from([np.float32, np.float64, np.float16]))
    scale = 10.0 ** draw(st.integers(-8, 4))
    golden = (rng.standard_normal(n) * scale).astype(dtype)
    mode = draw(st.sampled_from(["noise", "same", "zero_golden", "scaled", "sparse"]))
    if mode == "noise":
        target = (golden * (1 + rng.standard_normal(n) * 10.0 ** draw(st.integers(-7, -1)))).astype(
            dtype
        )
    elif mode == "same":
        target = golden.copy()
    elif mode == "zero_golden":
        golden[:] = 0
        target = (rng.standard_normal(n) * scale).astype(dtype)
    elif mode == "scaled":
        target = (golden * 2).astype(dtype)
    else:
        target = golden.copy()
        target[rng.random(n) < 0.1] = 0
    for arr in (golden, target):
        if n and draw(st.booleans()):
            idx = rng.integers(0, n, size=draw(st.integers(1, 4)))
            arr[idx] = rng.choice([np.nan, np.inf, -np.inf], size=idx.size)
    cuts_g = draw(st.lists(st.integers(0, n), max_size=5))
    cuts_t = draw(st.lists(st.integers(0, n), max_size=5))
    block = draw(st.sampled_from([1, 3, 16, 64, 1 << 15]))
    return golden, target, cuts_g, cuts_t, block


@settings(max_examples=300, deadline=None)
@given(pairs())
def test_streaming_equals_one_shot_reference(case) -> None:
    golden, target, cuts_g, cuts_t, block = case
    assert_close(streamed(golden, target, cuts_g, cuts_t, block), reference(golden, target, FLOOR))


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 2000), st.integers(0, 2**32 - 1), st.sampled_from([7, 100, 4096]))
def test_chunking_never_changes_the_result(n, seed, step) -> None:
    rng = np.random.default_rng(seed)
    golden = rng.standard_normal(n).astype(np.float32)
    target = (golden + rng.standard_normal(n).astype(np.float32) * 1e-3).astype(np.float32)
    one = MetricAccumulator(FLOOR)
    one.update(golden, target)
    many = MetricAccumulator(FLOOR, block=step)
    for start in range(0, n, step):
        many.update(golden[start : start + step], target[start : start + step])
    assert_close(many.result(), one.result())


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["close", "scaled", "negated", "zero_t"]), st.integers(-30, 30)),
        min_size=1,
        max_size=12,
    ),
    st.integers(0, 2**32 - 1),
    st.sampled_from([3, 16, 64]),
)
def test_cosine_when_blocks_mix_close_and_far_parts(parts, seed, block) -> None:
    """g·t is derived from the squared norms only in blocks whose vectors are close; blocks of
    wildly different scales (masks 30 orders apart) still give the plain quotient's cosine."""
    rng = np.random.default_rng(seed)
    gs, ts = [], []
    for kind, exp in parts:
        g = rng.standard_normal(block) * 10.0**exp
        if kind == "close":
            t = g * (1 + rng.standard_normal(block) * 1e-3)
        elif kind == "scaled":
            t = g * 10.0 ** rng.integers(-15, 16)
        elif kind == "negated":
            t = -g
        else:
            t = np.zeros(block)
        gs.append(g)
        ts.append(t)
    golden, target = np.concatenate(gs), np.concatenate(ts)
    acc = MetricAccumulator(FLOOR, block=block)
    acc.update(golden, target)
    got, want = acc.result(), reference(golden, target, FLOOR)
    assert math.isclose(got[m.COSINE], want[m.COSINE], rel_tol=0, abs_tol=1e-12), (got, want)
    for name in (m.RED, m.NORM_REL, m.MAX_ABS, m.MEAN_ABS, m.MAX_REL, m.MEAN_REL):
        assert math.isclose(got[name], want[name], rel_tol=1e-9, abs_tol=1e-12), name
