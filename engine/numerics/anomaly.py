"""Per-tensor anomaly checks that need no golden run: what ``layerwatch scan`` judges.

Each check reads a tensor's statistics (max/min/mean/L2 norm over the finite elements, NaN/Inf
counts: the ``stats`` every layerwatch index line carries), so a scan of a layerwatch dump never
loads a payload; other formats' tensors are reduced to the same statistics first
(``numerics/statistics.py``).

The kinds, worst first:

* ``nan`` — the output holds NaN;
* ``inf`` — the output holds ±Inf (fp16 overflow rounds to Inf in PyTorch);
* ``saturated`` — a finite value sits at the dtype's finite maximum (fp16 65504, bf16
  3.39e38) at the *positive* end: kernels that saturate instead of overflowing (an NPU's
  saturation mode, a clamp) leave this trace. The negative end is not judged: ``finfo.min`` is
  the value transformers puts where attention is masked, so an additive mask and the scores it
  was added to hold it by design (msprobe's API dumps show both: ``torch.where``,
  ``Tensor.__add__``); for the same reason a minimum at ``finfo.min`` counts for no magnitude;
* ``zero`` — a floating output that is all zeros while its (non-mask) floating inputs are not;
* ``jump`` — the output's largest magnitude exceeds both :data:`JUMP_RATIO` times the largest
  magnitude of its floating inputs and :data:`JUMP_FLOOR`.

Calibration of the jump bound (tests/engine/test_scan.py::test_benign_runs_raise_nothing,
numbers printed by tests/bench/calibrate_scan.py): on benign fp16/bf16/fp32 runs of tiny
random-weight Llama, Qwen2 and GPT-2 models the largest out/in magnitude ratio of any node is
59 (Qwen2's post-attention RMSNorm of a small residual: 0.05 → 3.2; Llama 51, GPT-2 36) and
the largest output magnitude 3.2; a ratio of 1000 leaves a 17× margin. The floor keeps normalisations of near-zero inputs
from firing: a norm's output is O(weight), never near 1000. Trained models carry "massive
activations" (hundreds to a few thousand in a few channels); raise ``--jump-ratio`` for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from layerwatch.engine.records import Stats

NAN = "nan"
INF = "inf"
SATURATED = "saturated"
ZERO = "zero"
JUMP = "jump"
KINDS = (NAN, INF, SATURATED, ZERO, JUMP)
"""Worst first: a row's ``anomaly`` is its first kind in this order."""

JUMP_RATIO = 1000.0
"""Output magnitude over input magnitude beyond which an output is a jump (see the module doc)."""
JUMP_FLOOR = 1000.0
"""A jump also needs an output magnitude above this (absolute): normalisations stay below it."""

FINITE_MAX = {
    "float16": 65504.0,
    "bfloat16": 3.3895313892515355e38,
    "float32": 3.4028234663852886e38,
    "float64": 1.7976931348623157e308,
    "float8_e4m3fn": 448.0,
    "float8_e5m2": 57344.0,
}
"""The largest finite value of each floating dtype (``torch.finfo(dtype).max``)."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """The jump rule's two numbers (``--jump-ratio``, ``--jump-floor``)."""

    ratio: float = JUMP_RATIO
    floor: float = JUMP_FLOOR


DEFAULT_BOUNDS = Bounds()


def is_float(dtype: str) -> bool:
    return dtype in FINITE_MAX or dtype.startswith(("float", "bfloat"))


MASK_VALUES = frozenset(-v for v in FINITE_MAX.values())
"""``torch.finfo(dtype).min`` of each dtype: the value transformers puts where attention is
masked (an additive mask, and the scores it was added to, hold it by design)."""


def magnitude(stats: Stats) -> float:
    """Largest finite magnitude (0.0 when there is no finite element), a minimum at a mask
    value (:data:`MASK_VALUES`) left out."""
    values = [abs(v) for v in (stats.max, stats.min) if not math.isnan(v) and v not in MASK_VALUES]
    return max(values, default=0.0)


def is_all_zero(stats: Stats) -> bool:
    return stats.nan == 0 and stats.inf == 0 and stats.max == 0.0 and stats.min == 0.0


def own_kinds(stats: Stats, dtype: str) -> list[str]:
    """The kinds a tensor shows by itself (``nan``, ``inf``, ``saturated``), worst first."""
    if not is_float(dtype):
        return []
    kinds = []
    if stats.nan:
        kinds.append(NAN)
    if stats.inf:
        kinds.append(INF)
    top = FINITE_MAX.get(dtype)
    if top is not None and stats.max >= top:
        kinds.append(SATURATED)
    return kinds


def output_kinds(
    out: Stats, dtype: str, inputs: list[Stats], bounds: Bounds = DEFAULT_BOUNDS
) -> list[str]:
    """Every kind an output shows, given its node's floating, non-mask inputs' statistics
    (``inputs`` empty: unknown — the zero and jump checks need them and are skipped)."""
    kinds = own_kinds(out, dtype)
    if not is_float(dtype) or not inputs:
        return kinds
    if is_all_zero(out) and any(not is_all_zero(s) for s in inputs):
        kinds.append(ZERO)
    out_mag = magnitude(out)
    in_mag = max(magnitude(s) for s in inputs)
    if out_mag > bounds.floor and out_mag > bounds.ratio * in_mag:
        kinds.append(JUMP)
    return kinds


def carries(kinds: list[str], input_kinds: set[str]) -> bool:
    """Does an input showing ``input_kinds`` explain an output showing ``kinds``?

    NaN or Inf in an input explains any output anomaly (NaN·0, Inf−Inf, a softmax of Inf);
    a saturated input explains a saturated or infinite output (the value kept growing).
    """
    if not kinds:
        return False
    if input_kinds & {NAN, INF}:
        return True
    return SATURATED in input_kinds and bool(set(kinds) & {SATURATED, INF})


def ratio(out: Stats, inputs: list[Stats]) -> float | None:
    """Output magnitude over the largest input magnitude (``None`` without inputs; inf for 0)."""
    if not inputs:
        return None
    in_mag = max(magnitude(s) for s in inputs)
    out_mag = magnitude(out)
    if in_mag == 0.0:
        return math.inf if out_mag else 1.0
    return out_mag / in_mag
