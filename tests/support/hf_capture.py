"""Capturing zoo runs with layerwatch's own hooks: a greedy KV-cache loop, teacher forcing, a cache.

The golden side is fp32 eager attention; the target is the same weights cast to bf16/fp16
(optionally sdpa), optionally with one fault from ``hf_faults.py``, fed the golden's ids so both
sides see the same inputs at every token.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
from argparse import Namespace
from pathlib import Path
from typing import Any

import torch

from .hf_faults import FAULTS
from .hf_models import DTYPES, build, prompt_ids


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
    if (out / "zoo.json").exists():  # a second run in one process would reuse {device}_{pid}
        raise ValueError(f"{out} already holds a zoo capture; give each capture its own directory")
    out.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # same reduction order in every process: cached runs stay comparable
    try:
        with register_hook(model, DumpConfig(dump_path=out, dump_weight=dump_weight)) as handle:
            fed, argmax = decode(model, prompt, new_tokens, forced_ids)
    finally:
        torch.set_num_threads(threads)
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


def _zoo_digest() -> str:
    """Hash of the zoo's own source: a changed model, fault, recipe or loop invalidates captures."""
    here = Path(__file__).parent
    text = b"".join(
        (here / f"hf_{name}.py").read_bytes() for name in ("models", "faults", "capture", "train")
    )
    return hashlib.sha256(text).hexdigest()


def _key(**args: Any) -> str:
    from .hf_train import versions

    blob = json.dumps({**args, "versions": versions(), "zoo": _zoo_digest()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _cached_capture(root: Path, **args: Any) -> Path:
    """``capture(**args)`` into ``root/<hash of args>``, reused when a finished copy is there."""
    key = _key(**args)
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

    Both are cached under ``tmp`` by a hash of their arguments, the torch/transformers versions
    and the zoo's source, so a session-scoped directory makes repeated use in tests cheap.
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


def compare_json(golden: Path, target: Path, **options: Any) -> tuple[int, dict[str, Any]]:
    """``layerwatch compare GOLDEN TARGET --json`` in this process: ``(exit code, report)``.

    Runs the command's own function (``engine/runner.py``) so tests and scripts see exactly
    what the CLI prints, without a Python start-up per comparison.
    """
    from layerwatch.engine.runner import compare_main

    args = Namespace(golden=str(golden), target=str(target), json=True, output=None, **options)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(io.StringIO()):
        code = compare_main(args)
    return code, json.loads(buffer.getvalue())
