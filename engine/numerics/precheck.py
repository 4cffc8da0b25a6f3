"""Operator precheck (算子精度预检): float64 references of single operators and the bound a
correct low-precision kernel stays within.

The target computed ``y = fl(op(x, W))`` from the inputs and weights it dumped, so recomputing
``op`` in float64 from exactly those values leaves only the kernel's own rounding as the
difference: upstream noise cannot be blamed on the op. Each reference returns the expected
output and an *error budget* from a first-order rounding analysis of the op as its framework
implements it; the bound is

    tol_i = u · E_i + u_acc · (I_i + √K · S_i) + tiny

* ``u`` — unit roundoff of the output dtype (bf16 2⁻⁸, fp16 2⁻¹¹, fp32 2⁻²⁴); ``E_i`` —
  magnitudes rounded to that dtype along the way (``|y_i|`` per rounding: one for a fused
  kernel, two for Llama's RMSNorm that casts x̂ before multiplying by w, a chain for
  NewGELU's Python formula, ``|y| + |x·Wᵀ|`` for a matmul that may round before its bias);
* ``u_acc`` = 2⁻²⁴ — kernels accumulate in fp32; ``K`` — reduction length; ``S_i`` —
  ``Σ_k |x_k||w_k|`` (probabilistic √K growth of the accumulation error); ``I_i`` — fp32
  intermediate magnitudes (normalisation statistics, transcendental functions, a few ulps);
* ``tiny`` — half the dtype's smallest subnormal spacing.

Two figures are judged, both *ratios* to their bound:

* ``element`` = maxᵢ |yₜ−y|ᵢ / tolᵢ — a worst-case bound (a correct kernel stays ≤ 1), catches
  local damage (an embedding row off by one, a zeroed block);
* ``norm`` = max over rows (last axis) of |‖yₜ‖−‖y‖|/‖y‖ divided by the spread random rounding
  gives it, √(Σ yᵢ² tolᵢ²)/(√3 ‖y‖²), plus the second-order ‖tol‖²/(2‖y‖²) and a row-shared
  allowance (the rsqrt of a norm, a softmax denominator). Cosine cannot see a pure scale error
  and the element bound sees it only at 2–5 units of u; this z-like figure sees a 2 % scale in
  bf16 at tens of its benign value.

An op fails when ``element > ELEMENT_LIMIT`` or ``norm > NORM_LIMIT``; the limits were
calibrated on benign bf16/fp16/fp32 dumps of Llama, Qwen2, Mistral, Gemma and GPT-2 (random
and trained weights, ``tests/bench/precheck_calibrate.py``) with a margin (figures in the
README). Pure numpy, no torch: imports only ``engine/records``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from layerwatch.engine.numerics.metrics import MetricAccumulator

CALL_STEMS = ("output", "output_0", "input_0", "input_1", "input_2", "input_3")
"""The tensors of one call a reference may use."""

ELEMENT_LIMIT = 2.0
"""A correct kernel's element ratio is ≤ 1 by construction; 2 leaves room for double rounding
the model does not list. Measured (tests/bench/precheck_calibrate.py, 5 architectures × bf16,
fp16, fp32 × random, trained): worst benign 0.996 (Mistral SiLU, fp32, trained; GPT-2
LayerNorm 0.995); weakest kernel fault 3.37 (GPT-2 c_proj ×1.02 in bf16)."""
NORM_LIMIT = 8.0
"""Benign row-norm figures are z-like: worst benign 2.85 (GPT-2 fp32, trained); weakest kernel
fault 21.3 (GPT-2 c_proj ×1.02 in bf16); eps faults 23.2 and up."""

UNIT_ROUNDOFF = {
    "float64": 2.0**-53,
    "float32": 2.0**-24,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
}
TINY = {
    "float64": 2.0**-1075,
    "float32": 2.0**-150,
    "float16": 2.0**-25,
    "bfloat16": 2.0**-134,
}
U_ACC = 2.0**-24
"""fp32 accumulation (cuBLAS, oneDNN, ATB matmul, torch's reduced-precision CPU kernels)."""
U_ACC64 = 2.0**-53


@dataclass(slots=True)
class Reference:
    """The float64 output of an op and the magnitudes its bound is made of (see module doc)."""

    values: np.ndarray
    rounded: np.ndarray | float = 0.0
    """``E``: magnitudes rounded to the output dtype (units of ``u``)."""
    internal: np.ndarray | float = 0.0
    """``I``: fp32 intermediate magnitudes (units of ``u_acc``)."""
    sums: np.ndarray | float = 0.0
    """``S``: Σ|x||w| of the reduction (0 without one)."""
    length: int = 0
    """``K``: reduction length."""
    row_shared: float = 0.0
    """Relative error shared by a whole row (in units of ``u_acc``), e.g. a norm's rsqrt."""


@dataclass(slots=True)
class Check:
    """One op's precheck: figures, the ratios to the bound, and whether it holds."""

    metrics: dict[str, float] = field(default_factory=dict)
    ok: bool = True
    reason: str = ""

    @property
    def ratio(self) -> float:
        return self.metrics.get(PRECHECK_RATIO, 0.0)


ELEMENT_RATIO = "precheck_element_ratio"
NORM_RATIO = "precheck_norm_ratio"
PRECHECK_RATIO = "precheck_ratio"
"""max(element/ELEMENT_LIMIT, norm/NORM_LIMIT): ≤ 1 passes (the grid colours by it)."""


def round_to(values: np.ndarray, dtype: str) -> np.ndarray:
    """float64 values rounded (to nearest even) to ``dtype``, returned as float64."""
    if dtype == "float16":
        return values.astype(np.float16).astype(np.float64)
    if dtype == "float32":
        return values.astype(np.float32).astype(np.float64)
    if dtype == "bfloat16":
        wide = values.astype(np.float32).view(np.uint32).astype(np.uint64)
        rounded = (
            (wide + np.uint64(0x7FFF) + ((wide >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
        ) << np.uint64(16)
        return rounded.astype(np.uint32).view(np.float32).astype(np.float64)
    return values.astype(np.float64)


# --- references ----------------------------------------------------------------------------
def matmul(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> Reference:
    """``y = x @ w (+ b)`` with ``w`` as [in, out] (transpose nn.Linear's weight first)."""
    prod = x @ w
    sums = np.abs(x) @ np.abs(w)
    y = prod if bias is None else prod + bias
    rounded = np.abs(y) if bias is None else np.abs(y) + np.abs(prod)
    if bias is not None:
        sums = sums + np.abs(bias)
    return Reference(y, rounded, 4 * np.abs(y), sums, int(w.shape[0]))


def embedding(ids: np.ndarray, table: np.ndarray, scale: float | None = None) -> Reference:
    """A gather (exact) and, for scaled embeddings, one rounded multiply."""
    y = table[ids]
    if scale is None:
        return Reference(y)
    y = y * scale
    return Reference(y, np.abs(y))


def _rms(x: np.ndarray, eps: float) -> tuple[np.ndarray, int]:
    k = int(x.shape[-1]) if x.ndim else 1
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps), k


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, *, plus_one: bool) -> Reference:
    """Llama style ``w·cast(x̂)`` (two roundings) or Gemma style ``(1+w)·x̂`` (one, in fp32)."""
    xhat, k = _rms(x, eps)
    shared = 2 + math.sqrt(k)  # the fp32 mean of squares and its rsqrt, shared by the row
    y = xhat * (1.0 + weight) if plus_one else xhat * weight
    internal = (4 + shared) * np.abs(y)
    return Reference(y, (1 if plus_one else 2) * np.abs(y), internal, 0.0, k, shared)


def layer_norm(
    x: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None, eps: float, dims: int
) -> Reference:
    """``(x−μ)/√(σ²+ε)·w + b`` over the last ``dims`` axes, computed in fp32, rounded once."""
    axes = tuple(range(x.ndim - dims, x.ndim))
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    sigma = np.sqrt(var + eps)
    xhat = (x - mu) / sigma
    w = 1.0 if weight is None else weight
    y = xhat * w if bias is None else xhat * w + bias
    k = int(np.prod([x.shape[a] for a in axes]))
    shared = 2 + math.sqrt(k)  # fp32 mean and variance, shared by the row
    scaled = np.abs(xhat * w)
    # the fp32 mean's rounding scales with the row's mean |x|, not with |μ|: in a row whose
    # values cancel (|μ| ≪ mean |x|) it is what an x near μ carries into x − μ
    spread = np.abs(x).mean(axis=axes, keepdims=True)
    internal = 8 * (np.abs(w) * (np.abs(x) + spread) / sigma + np.abs(y)) + shared * scaled
    return Reference(y, np.abs(y), internal, 0.0, k, shared)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _erf(z: np.ndarray) -> np.ndarray:
    vec = np.vectorize(math.erf, otypes=[np.float64])
    return vec(z) if z.size else z.copy()


def activation(x: np.ndarray, kind: str, scale: float = 1.0) -> Reference:
    """Element-wise activations. Fused kernels (torch's, ATB's) round once: ``E = |y|``;
    ``new_gelu`` and ``quick_gelu`` are transformers' Python formulas, rounded at every op."""
    if kind == "relu":
        return Reference(np.maximum(x, 0.0))
    if kind == "silu":
        y = x * _sigmoid(scale * x)
    elif kind == "sigmoid":
        y = _sigmoid(x)
    elif kind == "tanh":
        y = np.tanh(x)
    elif kind == "gelu":
        y = 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))
    elif kind == "gelu_tanh":
        y = 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    elif kind == "new_gelu":
        c = math.sqrt(2.0 / math.pi)
        a = c * (x + 0.044715 * x**3)
        t = np.tanh(a)
        y = 0.5 * x * (1.0 + t)
        arg = c * 0.0895 * np.abs(x) ** 3 + 2 * np.abs(a)
        d1t = (1 - t * t) * arg + 2 * np.abs(t) + np.abs(1 + t)
        return Reference(y, 0.5 * np.abs(x) * d1t + np.abs(y), 8 * np.abs(y))
    elif kind == "quick_gelu":
        s = _sigmoid(1.702 * x)
        y = x * s
        rounded = np.abs(x) * (s * (1 - s) * np.abs(1.702 * x) + 2 * s) + np.abs(y)
        return Reference(y, rounded, 8 * np.abs(y))
    else:
        raise ValueError(f"unknown activation {kind!r}")
    internal = 8 * np.abs(y)
    if kind in ("gelu", "gelu_tanh"):
        # 1 + erf/tanh cancels for negative x: fp32 loses relative accuracy where y → 0, but
        # its absolute error stays a few u_acc·|x| (measured ≤ 6 for torch's fp32 erf GELU).
        internal = internal + 8 * np.abs(x)
    return Reference(y, np.abs(y), internal)


def swiglu(x: np.ndarray, dim: int) -> Reference:
    """ATB SWIGLU_FORWARD: split ``x`` in halves along ``dim``, ``silu(a)·b``."""
    a, b = np.split(x, 2, axis=dim)
    y = a * _sigmoid(a) * b
    return Reference(y, 2 * np.abs(y), 8 * np.abs(y))


def softmax(x: np.ndarray, dim: int) -> Reference:
    z = x - np.max(x, axis=dim, keepdims=True)
    e = np.exp(z)
    y = e / e.sum(axis=dim, keepdims=True)
    k = int(x.shape[dim]) if x.ndim else 1
    shared = 2 + math.sqrt(k)  # the fp32 denominator, shared by the row
    return Reference(y, np.abs(y), (8 + shared) * np.abs(y), 0.0, k, shared)


def identity(x: np.ndarray) -> Reference:
    """Dropout in eval: the output is the input, bit for bit."""
    return Reference(x.copy())


def elementwise(a: np.ndarray, b: np.ndarray | float, kind: str) -> Reference:
    """ATB Elewise add / sub / mul / muls: one rounding."""
    ops: dict[str, Callable[[Any, Any], np.ndarray]] = {
        "add": np.add,
        "sub": np.subtract,
        "mul": np.multiply,
    }
    y = ops[kind](a, b)
    return Reference(y, np.abs(y))


# --- the bound ------------------------------------------------------------------------------
_COMPARED = (
    "max_absolute_error",
    "relative_euclidean_distance",
    "norm_relative_error",
    "cosine_similarity",
)
"""Compare metrics a precheck row also shows (``metrics.MetricAccumulator``'s definitions)."""


def judge(target: np.ndarray, ref: Reference, dtype: str) -> Check:
    """Compare the dumped output with the reference under the dtype's bound."""
    check = Check()
    y = np.asarray(ref.values, dtype=np.float64)
    t = np.asarray(target, dtype=np.float64)
    if t.shape != y.shape:
        if t.size == y.size:
            t = t.reshape(y.shape)
        else:
            check.ok = False
            check.reason = f"output shape {tuple(t.shape)} but the op gives {tuple(y.shape)}"
            return check
    u = UNIT_ROUNDOFF.get(dtype, UNIT_ROUNDOFF["float32"])
    tiny = TINY.get(dtype, 0.0)
    u_acc = U_ACC64 if dtype == "float64" else U_ACC
    finite_ref = np.isfinite(y)
    bad = finite_ref & ~np.isfinite(t)
    mismatch_nonfinite = int(bad.sum())
    both = finite_ref & np.isfinite(t)
    diff = np.where(both, np.abs(t - y), 0.0)
    tol = u * np.broadcast_to(ref.rounded, y.shape) + tiny
    tol = tol + u_acc * (
        np.broadcast_to(ref.internal, y.shape)
        + math.sqrt(max(ref.length, 1)) * np.broadcast_to(ref.sums, y.shape)
    )
    tol = np.maximum(tol, np.finfo(np.float64).tiny)
    element = float(np.max(diff / tol)) if diff.size else 0.0
    norm = _norm_figure(np.where(both, t, 0.0), np.where(both, y, 0.0), tol, ref.row_shared, u_acc)
    # the compare metrics of reference vs output, from their one home (finite positions only)
    acc = MetricAccumulator(1.0)
    acc.update(y, t)
    compared = acc.result()
    check.metrics = {name: compared[name] for name in _COMPARED} | {
        ELEMENT_RATIO: element,
        NORM_RATIO: norm,
        PRECHECK_RATIO: max(element / ELEMENT_LIMIT, norm / NORM_LIMIT),
        "nonfinite_mismatch": float(mismatch_nonfinite),
    }
    reasons = []
    if mismatch_nonfinite:
        reasons.append(f"{mismatch_nonfinite} non-finite outputs where the op gives finite values")
    if element > ELEMENT_LIMIT:
        reasons.append(
            f"an element is off by {element:.1f}× its rounding bound (limit {ELEMENT_LIMIT:g})"
        )
    if norm > NORM_LIMIT:
        reasons.append(
            f"a row's norm is off by {check.metrics['norm_relative_error']:.2%} overall, "
            f"{norm:.1f}× what rounding explains (limit {NORM_LIMIT:g})"
        )
    check.ok = not reasons
    check.reason = "; ".join(reasons)
    return check


def _norm_figure(
    t: np.ndarray, y: np.ndarray, tol: np.ndarray, shared: float, u_acc: float
) -> float:
    if y.size == 0:
        return 0.0
    cols = y.shape[-1] if y.ndim else 1
    y2, t2, tol2 = (a.reshape(-1, cols) for a in (y, t, tol))
    ynorm = np.sqrt(np.sum(y2 * y2, axis=1))
    tnorm = np.sqrt(np.sum(t2 * t2, axis=1))
    live = ynorm > 0
    if not live.any():
        return 0.0 if not np.any(tnorm) else math.inf
    yn, tn = ynorm[live], tnorm[live]
    rel = np.abs(tn - yn) / yn
    spread = np.sqrt(np.sum((y2[live] * tol2[live]) ** 2, axis=1)) / (math.sqrt(3) * yn * yn)
    second = np.sum(tol2[live] ** 2, axis=1) / (2 * yn * yn)
    allowed = spread + second + u_acc * shared
    allowed = np.maximum(allowed, np.finfo(np.float64).tiny)
    figure = float(np.max(rel / allowed))
    if np.any(~live & (tnorm > 0)):
        figure = math.inf
    return figure
