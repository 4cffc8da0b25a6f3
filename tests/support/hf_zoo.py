"""A zoo of tiny Hugging Face causal LMs, captured by layerwatch's own hooks, for realistic runs.

The golden side of a port is fp32 eager attention; the target is the same weights cast to
bf16/fp16 (optionally sdpa), optionally with one injected fault (``hf_faults.py``), fed the
golden's generated ids (teacher forcing) so both sides see the same inputs at every token.
Models are transformers' own ``*ForCausalLM`` classes with a small byte-level config; random
weights come from a seed, trained weights from ``hf_train.py`` (cached as safetensors), which
matter because training grows outlier activations and cancellations that random weights lack.

Everything runs on CPU; nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .hf_faults import FAULTS, Fault
from .hf_train import corpus_bytes, trained_state

ARCHS = ("llama", "qwen2", "mistral", "gemma", "gpt2")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
VOCAB = 256  # byte-level: token id = byte value
LAYERS = 3
HIDDEN = 64  # mistral: 96

__all__ = [
    "ARCHS",
    "DTYPES",
    "FAULTS",
    "Fault",
    "build",
    "capture",
    "config_for",
    "golden_and_target",
    "layer_prefix",
    "prompt_ids",
]


def _llama_like(cls_name: str, **shape: Any) -> Callable[[str], Any]:
    """Shapes differ per arch on purpose (head_dim, GQA ratio, MLP width) to vary the reductions."""

    def make(attn: str) -> Any:
        import transformers

        args: dict[str, Any] = {
            "hidden_size": HIDDEN,
            "intermediate_size": 176,
            "num_hidden_layers": LAYERS,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": VOCAB,
            "max_position_embeddings": 256,
            "attn_implementation": attn,
        }
        return getattr(transformers, cls_name)(**{**args, **shape})

    return make


def _gpt2(attn: str) -> Any:
    import transformers

    return transformers.GPT2Config(
        n_embd=HIDDEN,
        n_layer=LAYERS,
        n_head=4,
        vocab_size=VOCAB,
        n_positions=256,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation=attn,
    )


_CONFIGS: dict[str, Callable[[str], Any]] = {
    "llama": _llama_like("LlamaConfig"),
    "qwen2": _llama_like("Qwen2Config"),
    "mistral": _llama_like(
        "MistralConfig",
        hidden_size=96,
        intermediate_size=256,
        num_attention_heads=6,
        sliding_window=None,
    ),
    "gemma": _llama_like("GemmaConfig", head_dim=32, intermediate_size=192),
    "gpt2": _gpt2,
}
_CLASSES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gpt2": "GPT2LMHeadModel",
}


def _check_arch(arch: str) -> None:
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; one of {', '.join(ARCHS)}")


def config_for(arch: str, attn: str = "eager") -> Any:
    """The small transformers config of ``arch`` (byte vocabulary, 3 layers, 4–6 heads)."""
    _check_arch(arch)
    return _CONFIGS[arch](attn)


def layer_prefix(arch: str, layer: int) -> str:
    """Module path of decoder layer ``layer`` (``model.layers.1``, GPT-2: ``transformer.h.1``)."""
    _check_arch(arch)
    return f"transformer.h.{layer}" if arch == "gpt2" else f"model.layers.{layer}"


def build(
    arch: str, *, trained: bool = False, seed: int = 0, attn: str = "eager"
) -> torch.nn.Module:
    """transformers' ``*ForCausalLM`` for ``arch`` in fp32 and eval mode.

    Random weights are transformers' own initialisation under ``torch.manual_seed(seed)``;
    ``trained=True`` loads (training once, then caching) weights from ``hf_train.trained_state``.
    """
    import transformers

    config = config_for(arch, attn)
    torch.manual_seed(seed * 100 + ARCHS.index(arch))  # no two archs share initial weights
    model = getattr(transformers, _CLASSES[arch])(config)
    if trained:
        state = trained_state(arch, config, seed=seed, make=lambda: build(arch, seed=seed))
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [m for m in missing if not m.endswith(("inv_freq", "lm_head.weight"))]
        if missing or unexpected:
            raise RuntimeError(f"trained state of {arch}: missing {missing}, extra {unexpected}")
        model.tie_weights()
    model.eval()
    model.zoo_info = {"arch": arch, "trained": trained, "seed": seed}  # read by faults' probes
    return model


def prompt_ids(arch: str, n: int = 12, seed: int = 0, *, trained: bool = False) -> torch.Tensor:
    """``[1, n]`` int64 prompt: random bytes, or for trained models a slice of real text."""
    _check_arch(arch)
    if trained:
        text = corpus_bytes(held_out=True)
        start = (seed * 7919) % (len(text) - n)
        return torch.tensor([list(text[start : start + n])], dtype=torch.int64)
    gen = torch.Generator().manual_seed(1000 + seed)
    return torch.randint(0, VOCAB, (1, n), generator=gen, dtype=torch.int64)


def decode(
    model: torch.nn.Module,
    prompt: torch.Tensor,
    new_tokens: int,
    forced_ids: list[int] | None = None,
) -> tuple[list[int], list[int]]:
    """Greedy decoding with a KV cache: prefill, then ``new_tokens`` one-token steps.

    Returns ``(fed, argmax)``: the ids fed at steps 1..new_tokens (``forced_ids`` when given,
    else the model's own argmax) and the argmax after every step (``new_tokens + 1`` of them).
    """
    if forced_ids is not None and len(forced_ids) < new_tokens:
        raise ValueError(f"forced_ids has {len(forced_ids)} ids, {new_tokens} needed")
    fed: list[int] = []
    argmax: list[int] = []
    past = None
    ids = prompt
    with torch.no_grad():
        for step in range(new_tokens + 1):
            out = model(input_ids=ids, cache=past, use_cache=True)
            past = out.cache  # transformers 5: ``cache`` (``past_key_values`` is deprecated)
            argmax.append(int(out.logits[0, -1].float().argmax()))
            if step == new_tokens:
                break
            nxt = forced_ids[step] if forced_ids is not None else argmax[-1]
            fed.append(int(nxt))
            ids = torch.tensor([[nxt]], dtype=torch.int64)
    return fed, argmax


def capture(
    arch: str,
    out: Path,
    *,
    dtype: str = "fp32",
    attn: str = "eager",
    fault: str | None = None,
    trained: bool = False,
    new_tokens: int = 4,
    forced_ids: list[int] | None = None,
    dump_weight: bool = False,
    seed: int = 0,
    prompt_len: int = 12,
) -> Path:
    """Build, cast to ``dtype``, inject ``fault``, hook and decode; returns the dump directory.

    ``out`` is the ``DumpConfig.dump_path``; next to the run directory ``zoo.json`` records the
    prompt, the fed ids and the argmax ids (``golden_and_target`` forces the target with them).
    """
    from layerwatch.capture import DumpConfig, register_hook

    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; one of {', '.join(DTYPES)}")
    model = build(arch, trained=trained, seed=seed, attn=attn).to(DTYPES[dtype])
    if fault is not None:
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
        FAULTS[fault](arch).apply(model)
    prompt = prompt_ids(arch, prompt_len, seed, trained=trained)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with register_hook(model, DumpConfig(dump_path=out, dump_weight=dump_weight)) as handle:
        fed, argmax = decode(model, prompt, new_tokens, forced_ids)
    run_dir = handle.run_dir
    assert run_dir is not None
    record = {
        "arch": arch,
        "dtype": dtype,
        "attn": attn,
        "fault": fault,
        "trained": trained,
        "seed": seed,
        "prompt": prompt[0].tolist(),
        "fed": fed,
        "argmax": argmax,
        "run_dir": run_dir.name,
    }
    (out / "zoo.json").write_text(json.dumps(record, indent=1))
    return run_dir


def run_record(run_dir: Path) -> dict[str, Any]:
    """The ``zoo.json`` that ``capture`` wrote next to ``run_dir``."""
    return json.loads((Path(run_dir).parent / "zoo.json").read_text())


def _key(**args: Any) -> str:
    return hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()[:16]


def _cached_capture(root: Path, **args: Any) -> Path:
    """``capture(**args)`` into ``root/<hash of args>``, reused when a finished copy is there."""
    from .hf_train import versions

    key = _key(**args, versions=versions())
    final = root / key
    if (final / "zoo.json").is_file():
        return final / run_record_name(final)
    tmp = root / f".tmp-{key}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    capture(out=tmp, **args)
    try:
        tmp.rename(final)
    except OSError:  # another process finished the same capture first: use that one
        shutil.rmtree(tmp, ignore_errors=True)
    return final / run_record_name(final)


def run_record_name(dump_path: Path) -> str:
    return json.loads((Path(dump_path) / "zoo.json").read_text())["run_dir"]


def golden_and_target(
    arch: str,
    tmp: Path,
    *,
    dtype: str,
    fault: str | None = None,
    trained: bool = False,
    attn: str = "eager",
    new_tokens: int = 4,
    dump_weight: bool = False,
    seed: int = 0,
    prompt_len: int = 12,
) -> tuple[Path, Path]:
    """The fp32 eager golden run and the target forced onto the golden's fed ids.

    Both are cached under ``tmp`` by a hash of their arguments (and torch/transformers
    versions), so a session-scoped directory makes repeated use in tests cheap.
    """
    tmp = Path(tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    common = dict(
        arch=arch, trained=trained, new_tokens=new_tokens, seed=seed, prompt_len=prompt_len
    )
    golden = _cached_capture(tmp, dtype="fp32", attn="eager", dump_weight=dump_weight, **common)
    forced = run_record(golden)["fed"]
    target = _cached_capture(
        tmp,
        dtype=dtype,
        attn=attn,
        fault=fault,
        forced_ids=forced,
        dump_weight=dump_weight,
        **common,
    )
    return golden, target


def first_difference(golden: Path, target: Path) -> tuple[int, str] | None:
    """``(token, node)`` of the first tensor in the target's order whose bytes differ from the
    golden's (both dumps of the same dtype): where an fp32 fault enters, exactly."""
    from . import lwdump

    gold = lwdump.tensors(golden)
    for line in lwdump.index(target):
        if line["k"] != "t":
            continue
        other = gold.get((line["token"], line["node"], line["stem"]))
        if other is None or not torch.equal(lwdump.load(golden, other), lwdump.load(target, line)):
            return line["token"], line["node"]
    return None
