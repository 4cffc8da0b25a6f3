"""Faults of the size real porting bugs have, injected into a zoo model (``hf_zoo.py``).

Two kinds. ``weight`` faults change what a golden comparison sees (noisy weights, a scaled
output, a norm's eps attribute) and must be found by ``compare``. ``kernel`` faults leave every
weight and attribute correct but patch the module *instance*'s ``forward`` so it computes
something else, as a wrong kernel would: only recomputing the op from its own inputs finds
them. Each factory picks the middle decoder layer; ``apply`` mutates an already dtype-cast model
in place and is deterministic (fixed noise generator, probes without hooks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .hf_models import layer_prefix, prompt_ids

LAYER = 1  # middle of the zoo's 3 layers
NOISE = 0.04  # of the weight's std
NOISE_SEED = 4321
EPS_SHARE = 0.03  # a norm's eps is moved by this share of its input's prefill mean square


@dataclass(frozen=True)
class Fault:
    """One injected fault: ``node`` as layerwatch names it, bad from token ``from_token`` on."""

    name: str
    arch: str
    node: str
    from_token: int
    kind: str  # "weight" (visible against the golden) or "kernel" (the forward computes wrongly)
    describe: str
    apply: Callable[[torch.nn.Module], None]


def _paths(arch: str) -> dict[str, str]:
    """Module paths of the roles faults target, for ``arch``."""
    layer = layer_prefix(arch, LAYER)
    if arch == "gpt2":
        return {
            "mlp_in": f"{layer}.mlp.c_fc",
            "mlp_out": f"{layer}.mlp.c_proj",
            "v": f"{layer}.attn.c_attn",
            "o": f"{layer}.attn.c_proj",
            "norm_attn": f"{layer}.ln_1",
            "norm_mlp": f"{layer}.ln_2",
            "embed": "transformer.wte",
        }
    return {
        "mlp_in": f"{layer}.mlp.gate_proj",
        "mlp_out": f"{layer}.mlp.down_proj",
        "v": f"{layer}.self_attn.v_proj",
        "o": f"{layer}.self_attn.o_proj",
        "norm_attn": f"{layer}.input_layernorm",
        "norm_mlp": f"{layer}.post_attention_layernorm",
        "embed": "model.embed_tokens",
    }


def _token_clock(model: torch.nn.Module) -> list[int]:
    """``clock[0]`` = the token the model is computing (root calls so far, minus one).

    A pre-hook on the root registered before layerwatch's hooks, counting calls as they do.
    """
    clock = [-1]

    def tick(_module: torch.nn.Module, _args: Any) -> None:
        clock[0] += 1

    model.register_forward_pre_hook(tick)
    return clock


def _add_noise(module: torch.nn.Module, share: float) -> None:
    weight = module.weight
    gen = torch.Generator().manual_seed(NOISE_SEED)
    with torch.no_grad():
        w = weight.float()
        noise = torch.randn(w.shape, generator=gen) * w.std() * share
        weight.copy_((w + noise).to(weight.dtype))


def _scale_output(model: torch.nn.Module, path: str, factor: float, from_token: int) -> None:
    module = model.get_submodule(path)
    original = module.forward
    clock = _token_clock(model)

    def forward(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        return out * factor if clock[0] >= from_token else out

    module.forward = forward


def _eps_attr(module: torch.nn.Module) -> str:
    for name in ("variance_epsilon", "eps"):
        if isinstance(getattr(module, name, None), float):
            return name
    raise TypeError(f"{type(module).__name__} has no eps attribute")


def _probe_mean_square(model: torch.nn.Module, path: str) -> float:
    """Mean square of ``path``'s input over the prefill of the run's own prompt (no hooks yet)."""
    info = getattr(model, "zoo_info", {"arch": "llama", "trained": False, "seed": 0})
    ids = prompt_ids(info["arch"], seed=info["seed"], trained=info["trained"])
    seen: list[float] = []

    def grab(_m: torch.nn.Module, args: Any) -> None:
        seen.append(float(args[0].float().pow(2).mean()))

    handle = model.get_submodule(path).register_forward_pre_hook(grab)
    try:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    finally:
        handle.remove()
    return seen[0]


def _eps_shift(model: torch.nn.Module, path: str) -> float:
    """An eps that moves the norm's output by a few percent (``EPS_SHARE`` of the mean square)."""
    value = EPS_SHARE * _probe_mean_square(model, path)
    return float(f"{value:.2g}")


def linear_noise(arch: str) -> Fault:
    path = _paths(arch)["mlp_in"]

    def apply(model: torch.nn.Module) -> None:
        _add_noise(model.get_submodule(path), NOISE)

    return Fault(
        "linear_noise",
        arch,
        f"root.{path}",
        0,
        "weight",
        f"Gaussian noise of {NOISE:.0%} of the weight's std added to {path}.weight",
        apply,
    )


def v_proj_noise(arch: str) -> Fault:
    path = _paths(arch)["v"]

    def apply(model: torch.nn.Module) -> None:
        _add_noise(model.get_submodule(path), NOISE)

    return Fault(
        "v_proj_noise",
        arch,
        f"root.{path}",
        0,
        "weight",
        f"Gaussian noise of {NOISE:.0%} of the weight's std added to {path}.weight",
        apply,
    )


def output_scale(arch: str) -> Fault:
    path, start, factor = _paths(arch)["o"], 2, 1.03

    def apply(model: torch.nn.Module) -> None:
        _scale_output(model, path, factor, start)

    return Fault(
        "output_scale",
        arch,
        f"root.{path}",
        start,
        "weight",
        f"{path}'s output ×{factor} from token {start} on",
        apply,
    )


def norm_eps(arch: str) -> Fault:
    path = _paths(arch)["norm_mlp"]

    def apply(model: torch.nn.Module) -> None:
        module = model.get_submodule(path)
        name = _eps_attr(module)
        setattr(module, name, getattr(module, name) + _eps_shift(model, path))

    return Fault(
        "norm_eps",
        arch,
        f"root.{path}",
        0,
        "weight",
        f"{path}'s eps attribute raised by {EPS_SHARE:.0%} of its input's mean square",
        apply,
    )


def kernel_scale(arch: str) -> Fault:
    path, start, factor = _paths(arch)["mlp_out"], 1, 1.02

    def apply(model: torch.nn.Module) -> None:
        _scale_output(model, path, factor, start)

    return Fault(
        "kernel_scale",
        arch,
        f"root.{path}",
        start,
        "kernel",
        f"{path}'s forward scales its output ×{factor} from token {start} on",
        apply,
    )


def kernel_eps(arch: str) -> Fault:
    path = _paths(arch)["norm_attn"]

    def apply(model: torch.nn.Module) -> None:
        module = model.get_submodule(path)
        name = _eps_attr(module)
        correct = getattr(module, name)
        wrong = correct + _eps_shift(model, path)
        original = module.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            setattr(module, name, wrong)  # only while computing: hooks see the correct value
            try:
                return original(*args, **kwargs)
            finally:
                setattr(module, name, correct)

        module.forward = forward

    return Fault(
        "kernel_eps",
        arch,
        f"root.{path}",
        0,
        "kernel",
        f"{path}'s forward uses an eps larger by {EPS_SHARE:.0%} of its input's mean square"
        " than its attribute",
        apply,
    )


def gemma_plus_one(arch: str) -> Fault:
    if arch != "gemma":
        raise ValueError("gemma_plus_one applies to gemma only")
    path = _paths(arch)["norm_attn"]

    def apply(model: torch.nn.Module) -> None:
        module = model.get_submodule(path)

        def forward(x: torch.Tensor) -> torch.Tensor:
            out = module._norm(x.float()) * module.weight.float()  # (1 + w) ported as w
            return out.type_as(x)

        module.forward = forward

    return Fault(
        "gemma_plus_one",
        arch,
        f"root.{path}",
        0,
        "kernel",
        f"{path} (GemmaRMSNorm) computes w·x̂ instead of (1+w)·x̂",
        apply,
    )


def embedding_shift(arch: str) -> Fault:
    path, start = _paths(arch)["embed"], 1

    def apply(model: torch.nn.Module) -> None:
        module = model.get_submodule(path)
        original = module.forward
        clock = _token_clock(model)

        def forward(ids: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if clock[0] >= start:
                ids = (ids + 1) % module.num_embeddings
            return original(ids, *args, **kwargs)

        module.forward = forward

    return Fault(
        "embedding_shift",
        arch,
        f"root.{path}",
        start,
        "kernel",
        f"{path} gathers row id+1 from token {start} on",
        apply,
    )


FAULTS: dict[str, Callable[[str], Fault]] = {
    "linear_noise": linear_noise,
    "v_proj_noise": v_proj_noise,
    "output_scale": output_scale,
    "norm_eps": norm_eps,
    "kernel_scale": kernel_scale,
    "kernel_eps": kernel_eps,
    "gemma_plus_one": gemma_plus_one,
    "embedding_shift": embedding_shift,
}


def faults_for(arch: str) -> list[Fault]:
    """Every fault that applies to ``arch``."""
    return [
        make(arch) for name, make in FAULTS.items() if name != "gemma_plus_one" or arch == "gemma"
    ]
