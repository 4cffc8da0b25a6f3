"""Calibrate the default thresholds (engine/thresholds.toml) on real models, and check them.

Run (≈10 minutes on 2 shared cores; --quick ≈1 minute)::

    OMP_NUM_THREADS=1 python tests/bench/calibrate_thresholds.py              # full sweep
    OMP_NUM_THREADS=1 python tests/bench/calibrate_thresholds.py --quick      # 1 demo + 2 Llama configs
    ... --json calib.json          # also write every number
    ... --thresholds my.toml       # check a user file instead of the defaults

Models: the demo model (``layerwatch.capture.demo``: seed/layers 1234/6, 7/6, 2024/8, 1234/12,
99/24; 24 decode steps) and tiny HF ``LlamaForCausalLM`` with random weights (six
seed/layers/hidden configurations; 6 decode steps). For each: a golden fp32 greedy generation
with plain forward hooks on every module, then targets fed the *same* token ids (teacher
forcing, so every token is comparable): benign targets — a deterministic fp32 re-run, fp32 with
the other attention kernel (Llama: sdpa vs eager), a bf16 copy, an fp16 copy — and one target
per fault (the demo's ``FAULTS``; five Llama faults defined here), in fp32 and in bf16. Every
captured tensor pair (inputs and outputs of every module at every token) is compared with
``compare_arrays`` and judged, also as statistics-only records. The report gives the worst
benign value of every gated metric per dtype class (and where), each fault's metrics at its
operator at its start token, and what failed first. Exit status 1 if any benign pair fails or
an fp32 fault is not the first failure at its operator.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from layerwatch.engine.numerics.arrays import compare_arrays
from layerwatch.engine.numerics.compare import stats_metrics
from layerwatch.engine.numerics.thresholds import Thresholds, dtype_class
from layerwatch.engine.records import COSINE, EXACT, HIGHER_IS_BETTER, KL, RED, TOP1, Stats, Verdict
from layerwatch.engine.seam import MetricCheck

Key = tuple[int, str, str]  # token, node, stem


# -- capture with plain forward hooks ---------------------------------------------------------
@dataclass
class Capture:
    tensors: dict[Key, np.ndarray] = field(default_factory=dict)
    dtypes: dict[Key, str] = field(default_factory=dict)
    ids: list[int] = field(default_factory=list)
    """Generated ids (golden) or the ids fed (teacher-forced target)."""


def _flatten(value: Any, stem: str, out: list[tuple[str, torch.Tensor]]) -> None:
    if isinstance(value, torch.Tensor):
        out.append((stem, value))
    elif isinstance(value, tuple | list):
        for i, item in enumerate(value):
            _flatten(item, f"{stem}_{i}", out)
    elif isinstance(value, dict):  # ModelOutput included
        for name, item in value.items():
            _flatten(item, f"{stem}_{name}", out)


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach().cpu()
    if tensor.dtype in (torch.bfloat16, torch.float16):
        tensor = tensor.float()
    return tensor.numpy().copy()


def capture(
    model: torch.nn.Module,
    prompt: torch.Tensor,
    new_tokens: int,
    *,
    feed: list[int] | None = None,
    step: Callable[[torch.nn.Module, torch.Tensor, Any], tuple[torch.Tensor, Any]] | None = None,
) -> Capture:
    """Greedy decoding with every module's inputs/outputs recorded per token.

    ``feed`` = the ids to feed after the prompt (teacher forcing); otherwise argmax is fed.
    ``step(model, ids, state) -> (logits, state)`` runs one forward (default: HF with cache).
    """
    cap = Capture()
    token = [-1]
    names = {id(m): ("root" if not n else f"root.{n}") for n, m in model.named_modules()}

    def pre_root(module, args, kwargs):
        token[0] += 1

    def hook(module, args, kwargs, output):
        node = names[id(module)]
        found: list[tuple[str, torch.Tensor]] = []
        for i, arg in enumerate(args):
            _flatten(arg, f"input_{i}", found)
        for name, arg in kwargs.items():
            _flatten(arg, f"input_{name}", found)
        _flatten(output, "output", found)
        for stem, tensor in found:
            key = (token[0], node, stem)
            cap.tensors[key] = _numpy(tensor)
            cap.dtypes[key] = str(tensor.dtype).removeprefix("torch.")

    handles = [model.register_forward_pre_hook(pre_root, with_kwargs=True)]
    handles += [m.register_forward_hook(hook, with_kwargs=True) for m in model.modules()]
    step = step or _hf_step
    try:
        with torch.no_grad():
            ids, state = prompt, None
            for t in range(new_tokens + 1):
                logits, state = step(model, ids, state)
                nxt = int(logits[0, -1].float().argmax()) if feed is None else feed[t]
                cap.ids.append(nxt)
                ids = torch.tensor([[nxt]])
    finally:
        for h in handles:
            h.remove()
    return cap


def _hf_step(model, ids, cache):
    out = model(input_ids=ids, past_key_values=cache, use_cache=True)
    return out.logits, out.past_key_values


# -- models and faults ------------------------------------------------------------------------
@dataclass(frozen=True)
class Fault:
    name: str
    node: str
    """The operator the fault breaks (where it must be caught)."""
    start: int
    """First token at which it acts."""
    apply: Callable[[torch.nn.Module, list[int]], list[Any]]
    """Install on a target model copy; returns hook handles. Receives the token counter."""


def llama(seed: int, layers: int, hidden: int, vocab: int = 512) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    heads = max(2, hidden // 32)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(hidden * 2.75),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=256,
        attn_implementation="eager",
    )
    return LlamaForCausalLM(cfg).eval()


def _output_fault(node: str, start: int, fn: Callable[[torch.Tensor], torch.Tensor]):
    """A fault that rewrites ``node``'s (first) output from token ``start`` on."""

    def apply(model: torch.nn.Module, token: list[int]) -> list[Any]:
        module = model.get_submodule(node.removeprefix("root."))

        def hook(mod, args, output):
            if token[0] < start:
                return None
            if isinstance(output, tuple):
                return (fn(output[0]), *output[1:])
            return fn(output)

        return [module.register_forward_hook(hook)]

    return apply


def _weight_noise(node: str, rel: float):
    def apply(model: torch.nn.Module, token: list[int]) -> list[Any]:
        weight = model.get_submodule(node.removeprefix("root.")).weight
        gen = torch.Generator().manual_seed(99)
        noise = (
            torch.randn(weight.shape, generator=gen) * float(weight.detach().float().std()) * rel
        )
        with torch.no_grad():
            weight.add_(noise.to(weight.dtype))
        return []

    return apply


def _nan_at(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    t.view(-1)[t.numel() // 2] = float("nan")
    return t


def _rope_shift(t: torch.Tensor) -> torch.Tensor:
    return torch.roll(t, 1, dims=-1)


def llama_faults(layers: int) -> list[Fault]:
    k = min(1, layers - 1)
    last = layers - 1
    mlp = f"root.model.layers.{k}.mlp.down_proj"
    return [
        Fault("down_proj_weight_noise_5pct", mlp, 0, _weight_noise(mlp, 0.05)),
        Fault(
            "o_proj_scale_1.02",
            f"root.model.layers.{last}.self_attn.o_proj",
            2,
            _output_fault(f"root.model.layers.{last}.self_attn.o_proj", 2, lambda t: t * 1.02),
        ),
        Fault(
            "act_fn_nan",
            f"root.model.layers.{k}.mlp.act_fn",
            1,
            _output_fault(f"root.model.layers.{k}.mlp.act_fn", 1, _nan_at),
        ),
        Fault(
            "q_proj_rope_roll",
            "root.model.layers.0.self_attn.q_proj",
            3,
            _output_fault("root.model.layers.0.self_attn.q_proj", 3, _rope_shift),
        ),
        Fault(
            "lm_head_logit_bias",
            "root.lm_head",
            1,
            _output_fault(
                "root.lm_head",
                1,
                lambda t: t + (0.5 * (torch.arange(t.shape[-1]) % 7 == 0)).to(t.dtype),
            ),
        ),
    ]


# -- comparing --------------------------------------------------------------------------------
LOGITS_NODES = ("root.lm_head", "root")
"""Nodes whose output is the logits (HF Llama; the demo's are ``root.output`` and ``root``)."""


@dataclass
class Row:
    key: Key
    klass: str
    metrics: dict[str, float]
    verdict: Verdict
    failed: tuple[str, ...]
    reason: str
    checks: list[MetricCheck] = field(default_factory=list)


CLASS_ORDER = ("int", "fp32", "fp16", "bf16")


def compare_runs(
    golden: Capture, target: Capture, th: Thresholds, logits_nodes: tuple[str, ...] = LOGITS_NODES
) -> list[Row]:
    rows = []
    for key in [k for k in golden.tensors if k in target.tensors]:  # completion order
        g, t = golden.tensors[key], target.tensors[key]
        gd, td = golden.dtypes[key], target.dtypes[key]
        if g.shape != t.shape:
            rows.append(Row(key, "?", {}, Verdict.ERROR, (), "shape mismatch"))
            continue
        is_logits = key[1] in logits_nodes and key[2] in ("output", "output_logits") and g.ndim >= 1
        metrics = compare_arrays(g, t, logits=is_logits, rel_floor=th.floor(gd, td), topk=th.topk)
        kw = {
            "node": key[1],
            "golden_dtype": gd,
            "target_dtype": td,
            "is_logits": is_logits,
            "stem": key[2],
        }
        verdict, failed, reason = th.judge(metrics, **kw)
        klass = max(dtype_class(gd), dtype_class(td), key=CLASS_ORDER.index)
        klass += " logits" if is_logits else ""
        rows.append(Row(key, klass, metrics, verdict, failed, reason, th.checks(metrics, **kw)))
    return rows


# -- the sweep --------------------------------------------------------------------------------
CONFIGS_FULL = [(0, 2, 64), (1, 4, 128), (2, 8, 256), (3, 6, 512), (4, 8, 512), (5, 3, 384)]
CONFIGS_QUICK = [(0, 2, 64), (2, 4, 256)]


@dataclass
class Report:
    benign: dict[tuple[str, str], tuple[float, float, float, str]] = field(default_factory=dict)
    """(class, gated metric) → (utilisation, worst benign value, its limit, where)."""
    benign_failures: list[str] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)


def utilisation(name: str, value: float, limit: float, passed: bool) -> float:
    """How much of the limit a value uses (1.0 = at the limit; > 1 fails)."""
    if name in (TOP1, EXACT):  # all-or-nothing (top-1 flips at near-ties pass)
        return 0.0 if passed else math.inf
    if name == COSINE:
        return (1.0 - value) / max(1.0 - limit, 1e-300)
    if name in HIGHER_IS_BETTER:
        return (1.0 - value) / max(1.0 - limit, 1e-300) if limit < 1 else float(value < limit)
    return value / limit if limit else float(value > 0)


def note_benign(report: Report, rows: list[Row], th: Thresholds, where: str, stats: bool) -> None:
    for row in rows:
        token, node, stem = row.key
        here = f"{where} t{token} {node}:{stem}"
        if row.verdict is not Verdict.PASS:
            report.benign_failures.append(f"{here}: {row.reason}")
        for check in row.checks:
            if check.limit is None:
                continue
            slot = (row.klass + (" stats" if stats else ""), check.name)
            util = utilisation(check.name, check.value, check.limit, check.passed)
            old = report.benign.get(slot)
            if (
                old is None
                or util > old[0]
                or (util == old[0] and _worse(check.name, check.value, old[1]))
            ):
                report.benign[slot] = (util, check.value, check.limit, here)


def _worse(name: str, a: float, b: float) -> bool:
    return a < b if name in HIGHER_IS_BETTER else a > b


def stats_rows(golden: Capture, target: Capture, th: Thresholds) -> list[Row]:
    """The same pairs as statistics-only records (max/min/mean/norm, NaN/Inf counts)."""
    rows = []
    for key in [k for k in golden.tensors if k in target.tensors]:
        g, t = golden.tensors[key], target.tensors[key]
        gd, td = golden.dtypes[key], target.dtypes[key]
        if g.shape != t.shape:
            continue
        metrics = stats_metrics(_stats(g), _stats(t), numel=g.size, floor=th.floor(gd, td))
        kw = {"node": key[1], "golden_dtype": gd, "target_dtype": td, "stem": key[2]}
        verdict, failed, reason = th.judge(metrics, **kw)
        klass = max(dtype_class(gd), dtype_class(td), key=CLASS_ORDER.index)
        rows.append(Row(key, klass, metrics, verdict, failed, reason, th.checks(metrics, **kw)))
    return rows


def _stats(a: np.ndarray) -> Stats:
    x = a.astype(np.float64).ravel()
    fin = np.isfinite(x)
    nan = int(np.isnan(x).sum())
    x = x[fin]
    if not x.size:
        return Stats(math.nan, math.nan, math.nan, 0.0, nan, a.size - nan)
    return Stats(
        float(x.max()),
        float(x.min()),
        float(x.mean()),
        float(np.sqrt(x @ x)),
        nan,
        a.size - x.size - nan,
    )


def run_config(
    label: str,
    model: torch.nn.Module,
    prompt: torch.Tensor,
    new_tokens: int,
    faults: list[Fault],
    th: Thresholds,
    report: Report,
    fault_dtypes=("float32", "bfloat16"),
) -> None:
    golden = capture(model, prompt, new_tokens)
    feed = golden.ids
    for name, target_model in benign_targets(model).items():
        target = capture(target_model, prompt, new_tokens, feed=feed)
        note_benign(report, compare_runs(golden, target, th), th, f"{label} {name}", stats=False)
        note_benign(report, stats_rows(golden, target, th), th, f"{label} {name}", stats=True)
    for fault in faults:
        for dtype in fault_dtypes:
            target = capture_with_fault(model, fault, dtype, prompt, new_tokens, feed)
            report.faults.append(
                fault_outcome(label, fault, dtype, compare_runs(golden, target, th))
            )


def capture_with_fault(
    model: torch.nn.Module,
    fault: Fault,
    dtype: str,
    prompt: torch.Tensor,
    new_tokens: int,
    feed: list[int],
) -> Capture:
    """A broken copy of ``model`` in ``dtype``, run teacher-forced on ``feed``."""
    target_model = copy.deepcopy(model).to(getattr(torch, dtype))
    token = [-1]
    counter = target_model.register_forward_pre_hook(lambda *a: token.__setitem__(0, token[0] + 1))
    handles = fault.apply(target_model, token)
    try:
        return capture(target_model, prompt, new_tokens, feed=feed)
    finally:
        counter.remove()
        for h in handles:
            h.remove()


def benign_targets(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Deterministic re-run, the other attention kernel (fp32 noise of a different kernel), bf16, fp16."""
    other = copy.deepcopy(model)
    other.set_attn_implementation("sdpa")
    return {
        "fp32 rerun": model,
        "fp32 sdpa": other,
        "bf16": copy.deepcopy(model).to(torch.bfloat16),
        "fp16": copy.deepcopy(model).to(torch.float16),
    }


def fault_outcome(label: str, fault: Fault, dtype: str, rows: list[Row]) -> dict[str, Any]:
    at = [
        r
        for r in rows
        if r.key[0] == fault.start and r.key[1] == fault.node and r.key[2].startswith("output")
    ]
    return {
        "config": label,
        "fault": fault.name,
        "dtype": dtype,
        "node": fault.node,
        "start": fault.start,
        "caught": any(r.verdict is Verdict.FAIL for r in at),
        "metrics": at[0].metrics if at else {},
        "reason": at[0].reason if at else "not captured",
        "earlier_failures": sum(
            1 for r in rows if r.verdict is not Verdict.PASS and r.key[0] < fault.start
        ),
        "first_failure": next(
            (f"t{r.key[0]} {r.key[1]}:{r.key[2]}" for r in rows if r.verdict is not Verdict.PASS),
            None,
        ),
    }


# -- the demo model (layerwatch.capture.demo) -------------------------------------------------
DEMO_LOGITS = ("root.output", "root")
DEMO_CONFIGS = ((1234, 6), (7, 6), (2024, 8), (1234, 12), (99, 24))
"""(seed, layers): the default demo, another seed, deeper ones (bf16 noise stops growing)."""


def demo_step(
    model: torch.nn.Module, ids: torch.Tensor, pos: int | None
) -> tuple[torch.Tensor, int]:
    if pos is None:  # a new generation: the demo's faults count tokens from 0
        model.ctx.step = 0
        pos = 0
    return model(ids, pos), pos + ids.shape[1]


def run_demo(seed: int, layers: int, new_tokens: int, th: Thresholds, report: Report) -> None:
    """Benign demo targets (fp32 re-run, bf16, fp16) and every FAULTS entry (fp32 and bf16)."""
    from dataclasses import replace

    from layerwatch.capture import demo

    cfg = replace(demo.DemoConfig(), seed=seed, n_layers=layers)
    label = f"demo(seed={seed},L={layers})"
    prompt = demo.make_prompt(vocab_size=cfg.vocab_size)
    golden = capture(demo.build_model(config=cfg), prompt, new_tokens, step=demo_step)
    for dtype in ("fp32", "bf16", "fp16"):
        target = capture(
            demo.build_model(dtype=dtype, config=cfg),
            prompt,
            new_tokens,
            feed=golden.ids,
            step=demo_step,
        )
        name = f"{label} {dtype}{' rerun' if dtype == 'fp32' else ''}"
        note_benign(report, compare_runs(golden, target, th, DEMO_LOGITS), th, name, stats=False)
        note_benign(report, stats_rows(golden, target, th), th, name, stats=True)
    for fault in demo.FAULTS.values():
        for dtype in ("fp32", "bf16"):
            model = demo.build_model(dtype=dtype, fault=fault.name, config=cfg)
            target = capture(model, prompt, new_tokens, feed=golden.ids, step=demo_step)
            spec = Fault(fault.name, fault.node, fault.start_token, lambda m, t: [])
            rows = compare_runs(golden, target, th, DEMO_LOGITS)
            report.faults.append(
                fault_outcome(label, spec, "float32" if dtype == "fp32" else "bfloat16", rows)
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="two small configurations only")
    parser.add_argument(
        "--thresholds", default=None, help="a user thresholds file to check instead"
    )
    parser.add_argument("--new-tokens", type=int, default=6)
    parser.add_argument("--prompt-len", type=int, default=12)
    parser.add_argument("--json", default=None, help="write every number to this file")
    parser.add_argument("--demo-tokens", type=int, default=24, help="decode steps of the demo runs")
    parser.add_argument("--skip-demo", action="store_true", help="HF Llama configurations only")
    parser.add_argument("--skip-llama", action="store_true", help="the demo model only")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    th = Thresholds.load(args.thresholds)
    report = Report()
    if not args.skip_demo:
        for seed, layers in DEMO_CONFIGS[:1] if args.quick else DEMO_CONFIGS:
            run_demo(seed, layers, args.demo_tokens, th, report)
            print(f"done demo seed {seed}", file=sys.stderr)
    for seed, layers, hidden in (
        () if args.skip_llama else CONFIGS_QUICK if args.quick else CONFIGS_FULL
    ):
        label = f"llama(seed={seed},L={layers},h={hidden})"
        model = llama(seed, layers, hidden)
        prompt = torch.randint(
            0, 512, (1, args.prompt_len), generator=torch.Generator().manual_seed(seed)
        )
        run_config(label, model, prompt, args.new_tokens, llama_faults(layers), th, report)
        print(f"done {label}", file=sys.stderr)
    print_report(report, th)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "benign": {f"{c}|{m}": v[1:] for (c, m), v in report.benign.items()},
                    "benign_failures": report.benign_failures,
                    "faults": report.faults,
                },
                fh,
                indent=1,
                default=str,
            )
    missed = [
        f
        for f in report.faults
        if f["dtype"] == "float32"
        and not (
            f["caught"] and (f["first_failure"] or "").startswith(f"t{f['start']} {f['node']}:")
        )
    ]
    return 1 if report.benign_failures or missed else 0


def print_report(report: Report, th: Thresholds) -> None:
    print("== worst benign value per gated metric and dtype class (all tokens, all tensors) ==")
    print("   targets: fp32 re-run, fp32 with sdpa attention, bf16 copy, fp16 copy; teacher-forced")
    for (klass, metric), (util, value, limit, where) in sorted(report.benign.items()):
        margin = f"×{1 / util:.3g}" if util > 0 else "∞"
        print(
            f"  {klass:18s} {metric:28s} worst {value:<12.6g} limit {limit:<8g} margin {margin:>7}  ({where})"
        )
    print(f"== benign failures: {len(report.benign_failures)} ==")
    for line in report.benign_failures[:30]:
        print("  " + line)
    print("== faults at their operator, at their start token ==")
    for f in report.faults:
        m = f["metrics"]
        print(
            f"  {'CAUGHT' if f['caught'] else 'MISSED':6s} {f['dtype']:8s} {f['config']:26s} {f['fault']:28s}"
            f" t{f['start']} cos {m.get(COSINE, math.nan):.6f} RED {m.get(RED, math.nan):.4g}"
            f" KL {m.get(KL, math.nan):.3g} | first failure {f['first_failure']} | {f['reason']}"
        )


if __name__ == "__main__":
    sys.exit(main())
