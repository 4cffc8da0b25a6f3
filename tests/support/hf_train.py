"""Trained weights for the zoo: a short, seeded, single-thread CPU training on stdlib source text.

Trained weights matter because training grows outlier activations in the residual stream and
cancellations between large terms, which is where low-precision rounding hurts; random
weights show neither. The text is Python standard-library source (on every machine), read as
bytes; the result is cached as safetensors under ``$LAYERWATCH_TEST_CACHE`` (default
``~/.cache/layerwatch-tests``), keyed by config, recipe, corpus and library versions, and
written atomically so concurrent test processes and scripts can share it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import torch

RECIPE = {
    "steps": 1600,
    "batch": 8,
    "seq": 64,
    "lr": 4e-3,
    "weight_decay": 0.0,
    "beta2": 0.95,
    "warmup": 20,
    "data_seed": 17,
    "bos": 1,
}
BOS = 0  # NUL, absent from source text: every window and trained prompt starts with it, as a
# real prompt starts with a BOS token (the position where trained models park attention)
TRAIN_FILES = (
    "argparse.py",
    "textwrap.py",
    "functools.py",
    "json/decoder.py",
    "json/encoder.py",
    "heapq.py",
    "shlex.py",
    "string.py",
    "bisect.py",
    "fractions.py",
)
HELD_OUT = "difflib.py"  # prompts for trained models: real text the model was not trained on


@cache
def corpus_bytes(held_out: bool = False) -> bytes:
    """Training text (or the held-out file) from the running Python's standard library."""
    root = Path(sysconfig.get_paths()["stdlib"])
    names = (HELD_OUT,) if held_out else TRAIN_FILES
    return b"\n".join((root / name).read_bytes() for name in names if (root / name).is_file())


def versions() -> dict[str, str]:
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__}


def cache_dir() -> Path:
    env = os.environ.get("LAYERWATCH_TEST_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "layerwatch-tests"


def cache_key(arch: str, config: Any, seed: int) -> str:
    blob = json.dumps(
        {
            "arch": arch,
            "config": config.to_dict(),
            "recipe": RECIPE,
            "seed": seed,
            "corpus": hashlib.sha256(corpus_bytes()).hexdigest(),
            "versions": versions(),
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def train(model: torch.nn.Module, seed: int = 0) -> list[float]:
    """Train ``model`` in place on the corpus by ``RECIPE``; returns the loss of every step.

    Deterministic: one thread, fixed seeds, batches from a seeded generator.
    """
    data = torch.frombuffer(bytearray(corpus_bytes()), dtype=torch.uint8).long()
    steps, batch, seq = RECIPE["steps"], RECIPE["batch"], RECIPE["seq"]
    gen = torch.Generator().manual_seed(RECIPE["data_seed"] + seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    optim = torch.optim.AdamW(
        model.parameters(),
        lr=RECIPE["lr"],
        weight_decay=RECIPE["weight_decay"],
        betas=(0.9, RECIPE["beta2"]),
    )
    warmup = RECIPE["warmup"]
    sched = torch.optim.lr_scheduler.LambdaLR(
        optim, lambda s: min(1.0, (s + 1) / warmup) * max(0.1, 1 - s / steps)
    )
    losses: list[float] = []
    model.train()
    try:
        for _ in range(steps):
            starts = torch.randint(0, len(data) - seq, (batch,), generator=gen)
            window = torch.stack([data[s : s + seq] for s in starts.tolist()])
            if RECIPE["bos"]:
                window[:, 0] = BOS
            out = model(input_ids=window, labels=window, use_cache=False)  # HF shifts labels
            optim.zero_grad(set_to_none=True)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optim.step()
            sched.step()
            losses.append(float(out.loss.detach()))
    finally:
        model.eval()
        torch.set_num_threads(threads)
    return losses


def trained_state(
    arch: str, config: Any, *, seed: int, make: Callable[[], torch.nn.Module]
) -> dict[str, torch.Tensor]:
    """The trained state dict for ``arch``: from the cache, or trained (``make()`` builds the
    random-initialised fp32 model) and cached. ``<key>.json`` beside it keeps the losses."""
    from safetensors.torch import load_file, save_file

    directory = cache_dir()
    key = cache_key(arch, config, seed)
    path = directory / f"{arch}-{key}.safetensors"
    if path.is_file():
        return load_file(str(path))
    model = make()
    began, began_cpu = time.perf_counter(), time.process_time()
    losses = train(model, seed)
    seconds, cpu = time.perf_counter() - began, time.process_time() - began_cpu
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    tied = getattr(config, "tie_word_embeddings", False)
    if tied:
        state.pop("lm_head.weight", None)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".tmp-{path.name}-{os.getpid()}"
    save_file(state, str(tmp))
    os.replace(tmp, path)
    info = {
        "losses": losses,
        "seconds": round(seconds, 1),
        "cpu_seconds": round(cpu, 1),
        "recipe": RECIPE,
        "arch": arch,
    }
    meta_tmp = directory / f".tmp-{path.stem}.json-{os.getpid()}"
    meta_tmp.write_text(json.dumps(info))
    os.replace(meta_tmp, path.with_suffix(".json"))
    return state


def training_info(arch: str, config: Any, seed: int = 0) -> dict[str, Any] | None:
    """Losses and seconds of a cached training run, or ``None`` when not trained yet."""
    path = cache_dir() / f"{arch}-{cache_key(arch, config, seed)}.json"
    return json.loads(path.read_text()) if path.is_file() else None
