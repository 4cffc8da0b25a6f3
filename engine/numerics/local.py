"""Local verdicts: the error an operator *introduces*, beyond what its inputs already carried.

A bf16/fp16 target's rounding grows with depth, so a global limit on an output's error against
the golden run is either blind to a few-percent fault or noisy in deep layers. An operator is
therefore also judged by its output error compared with the largest error among its own input
tensors (both measured against the golden run), in units of the target dtype's unit roundoff
``u`` (bf16 2⁻⁸, fp16 2⁻¹¹, fp32 2⁻²⁴):

* noise:  ``(RED_out − gain · RED_in) / u``   RED = ‖t − g‖ / ‖g‖ (relative Euclidean distance)
* scale:  ``(NRE_out − gain · NRE_in) / u``   NRE = |‖t‖ − ‖g‖| / ‖g‖ (norm-relative error)

Each is divided by its limit for the operator's kind and the pair's dtype class, and the larger
quotient is the pair's ``local_error``: above 1 the operator fails ("introduces error"). The
scale term is what finds a 2-3 % output scale or a wrong norm epsilon, which rounding noise
barely moves (NRE ≈ RED²/2); the noise term finds noisy weights. Limits per kind live in
``engine/thresholds.toml`` (``[local.<class>]``), calibrated on benign runs of five transformers
architectures by ``tests/bench/calibrate_local.py``.

An output whose node has no captured float input is not judged locally (nothing to compare
with) except an embedding, whose integer ids carry no error: its input error is 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from layerwatch.engine.records import NORM_REL, RED, slot_setters

UNIT_ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11, "fp32": 2.0**-24}
"""Unit roundoff of each float dtype class (half the distance from 1 to the next value)."""

KINDS = (
    "linear",
    "norm",
    "activation",
    "embedding",
    "rotary",
    "dropout",
    "attention",
    "mlp",
    "layer",
    "other",
)
"""Operator kinds :func:`op_kind` tells apart. Only those with limits in thresholds.toml are
judged locally (the leaf kinds by default): containers (attention, mlp, layer, other) mix
inner operators, residual sums and masks, and a fault inside one fails first at its inner
operator; a rotary embedding computes from positions, not from its input's values."""


@lru_cache(maxsize=1024)  # a model has a few dozen module classes, asked once per pair
def op_kind(node_type: str) -> str:
    """The kind of a module from its class name (``Linear``, ``LlamaRMSNorm``, ``Conv1D`` ...)."""
    t = node_type.rsplit(".", 1)[-1].lower()
    if t in ("linear", "conv1d") or t.endswith(("linear", "linearbase")):
        return "linear"
    if "norm" in t:
        return "norm"
    if "rotary" in t:
        return "rotary"
    if "embedding" in t:
        return "embedding"
    if "dropout" in t:
        return "dropout"
    if "attention" in t or t.endswith("attn"):
        return "attention"
    if "mlp" in t or "feedforward" in t:
        return "mlp"
    if "decoderlayer" in t or t.endswith("block"):
        return "layer"
    if any(a in t for a in ("act", "gelu", "silu", "relu", "sigmoid", "tanh", "softmax", "swish")):
        return "activation"
    return "other"


@dataclass(frozen=True, slots=True)
class LocalLimit:
    """Limits of one operator kind and dtype class, in units of ``u`` (see the module doc)."""

    red_gain: float
    red: float
    scale_gain: float
    scale: float


@dataclass(frozen=True, slots=True)
class LocalFigure:
    """What the local judgement found for one output pair."""

    ratio: float
    """max(noise excess / its limit, scale excess / its limit): above 1 fails."""
    input_error: float
    """Largest RED among the node's float inputs (0 for an embedding's ids)."""
    part: str
    """``noise`` or ``scale``: which term set ``ratio``."""
    excess_u: float
    """That term's excess over gain × input error, in units of u."""
    limit_u: float
    gain: float
    klass: str

    def reason(self, kind: str) -> str:
        """One line for the verdict: what the operator added beyond its inputs' error."""
        what = "noise" if self.part == "noise" else "scale error"
        return (
            f"introduces {what}: {self.excess_u:.1f} u beyond {self.gain:g}× its inputs' "
            f"error (input RED {self.input_error:.2g}); {self.ratio:.1f}× the "
            f"{self.klass} {kind} allowance of {self.limit_u:g} u (local verdict)"
        )

    @property
    def failed(self) -> bool:
        return self.ratio > 1.0


def local_figure(
    out: dict[str, float],
    inputs: Iterable[dict[str, float]],
    klass: str,
    limit: LocalLimit,
) -> LocalFigure | None:
    """The local figure of one output, or None when it cannot be judged (no input error known,
    an integer class, metrics missing or not finite)."""
    u = UNIT_ROUNDOFF.get(klass)
    red_out, nre_out = out.get(RED), out.get(NORM_REL)
    if u is None or red_out is None or nre_out is None:
        return None
    ins = [m for m in inputs if RED in m and NORM_REL in m]
    if not ins:
        return None
    red_in = max(m[RED] for m in ins)
    nre_in = max(m[NORM_REL] for m in ins)
    if not (
        math.isfinite(red_out)
        and math.isfinite(nre_out)
        and math.isfinite(red_in)
        and math.isfinite(nre_in)
    ):
        return None  # NaN/Inf are the non-finite gate's business
    noise = (red_out - limit.red_gain * red_in) / u
    scale = (nre_out - limit.scale_gain * nre_in) / u
    # the larger share of its limit; noise on a tie (as max() over [noise, scale] picks)
    if scale / limit.scale > noise / limit.red:
        return _figure(
            scale / limit.scale, red_in, "scale", scale, limit.scale, limit.scale_gain, klass
        )
    return _figure(noise / limit.red, red_in, "noise", noise, limit.red, limit.red_gain, klass)


_FIGURE_SLOTS = slot_setters(LocalFigure)


def _figure(
    ratio: float,
    input_error: float,
    part: str,
    excess_u: float,
    limit_u: float,
    gain: float,
    klass: str,
) -> LocalFigure:
    """``LocalFigure(...)`` with its slots set directly: the frozen dataclass's ``__init__``
    pays an ``object.__setattr__`` call a field (a figure is made for most output pairs;
    ``records.plain_locator`` does the same for a locator). The same object as the
    constructor's (``tests/engine/test_pair_rate_paths.py``)."""
    figure = object.__new__(LocalFigure)
    s = _FIGURE_SLOTS
    s[0](figure, ratio)
    s[1](figure, input_error)
    s[2](figure, part)
    s[3](figure, excess_u)
    s[4](figure, limit_u)
    s[5](figure, gain)
    s[6](figure, klass)
    return figure


def embedding_input() -> dict[str, float]:
    """The error of an embedding's integer ids: none (they are compared exactly)."""
    return {RED: 0.0, NORM_REL: 0.0}
