"""Named faults for the demo target: each breaks exactly ONE operator from a known token on.

``FAULTS[name]`` says what is broken (``node``, the dotted path as layerwatch names it), from
which token (``start_token``, 0 = prefill) and how. Strengths were chosen so that the broken
operator's output is clearly off (cosine well below 0.999, or a large relative error when the
fault only rescales) without being absurd; the measured figures are in
``tests/capture/test_demo.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..errors import LayerwatchError

if TYPE_CHECKING:
    from .model import Transformer


@dataclass(frozen=True)
class Fault:
    name: str
    description: str
    node: str
    """The operator it breaks, e.g. ``root.layers.3.attention.cache``."""
    start_token: int
    """First token (root forward call, 0 = prefill) computed with the fault."""
    layer: int
    eps: float = 0.0
    """``rmsnorm_eps``: the wrong epsilon."""
    noise: float = 0.0
    """``noisy_weight``: noise standard deviation relative to the weight's."""


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault(
            "kv_cache",
            "KV-cache write lands one slot early from decode step 5 on (layer 3): an "
            "entry is overwritten and the newest one stays zero",
            "root.layers.3.attention.cache",
            5,
            3,
        ),
        Fault(
            "noisy_weight",
            "Gaussian noise (15% of its std) on layers.2.feed_forward.w2's weight",
            "root.layers.2.feed_forward.w2",
            0,
            2,
            noise=0.15,
        ),
        Fault(
            "rmsnorm_eps",
            "layers.1.ffn_norm uses epsilon 0.5 instead of 1e-6 from token 2 on",
            "root.layers.1.ffn_norm",
            2,
            1,
            eps=0.5,
        ),
        Fault(
            "softmax_fp16",
            "layers.4 attention softmax exponentiates the unscaled scores in fp16 "
            "from token 3 on: exp overflows to inf, rows turn NaN",
            "root.layers.4.attention.softmax",
            3,
            4,
        ),
        Fault(
            "rotary_swap",
            "layers.1 rotary embedding swaps the rotate-half halves from token 4 on "
            "(rotates by -theta)",
            "root.layers.1.attention.rope",
            4,
            1,
        ),
    )
}
DEFAULT_FAULT = "kv_cache"
"""Clean first rows, then a failure that starts mid-model (layer 3) at token 5."""


def get_fault(name: str) -> Fault:
    fault = FAULTS.get(name)
    if fault is None:
        raise LayerwatchError(
            f"unknown fault {name!r}: choose one of {', '.join(FAULTS)} (or none)"
        )
    return fault


def apply_fault(model: Transformer, name: str) -> Fault:
    """Arm fault ``name`` in ``model`` (a demo ``Transformer``, still in float32)."""
    fault = get_fault(name)
    n_layers = len(model.layers)
    if fault.layer >= n_layers:
        raise LayerwatchError(
            f"fault {name} breaks layer {fault.layer}: use --layers {fault.layer + 1} or more"
        )
    from .model import Faultable, Linear

    module = model.get_submodule(fault.node.removeprefix("root."))
    assert isinstance(module, Faultable)  # every fault names a Faultable operator
    module.fault = fault
    if fault.noise:
        assert isinstance(module, Linear)  # only a Linear's weight takes noise
        weight = module.weight.detach()
        gen = torch.Generator().manual_seed(model.cfg.seed + 1)
        module.noise = torch.randn(weight.shape, generator=gen) * (
            fault.noise * float(weight.float().std())
        )
    return fault
