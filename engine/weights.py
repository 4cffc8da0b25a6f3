"""``layerwatch weights GOLDEN TARGET``: are two checkpoints the same model, tensor by tensor?

Half of porting bugs are in the weights (a bad conversion script, a wrong quantisation scale,
a transposed or swapped tensor, a truncated shard). Each side is read by
engine/readers/checkpoints.py; names are matched exactly, then without a common wrapper prefix
(``model.``, ``module.``, ``root.``, ``_orig_mod.``), then by fingerprint (same shape, same
norm and mean to 1 %: a renamed tensor); what stays unmatched is listed.

Quantised targets are dequantised first, msit's rule: an int8 ``X.weight`` with
``X.weight_scale`` (one value, or one per output channel) and an optional ``X.weight_offset``
becomes ``(w − offset) · scale``; a float8 ``X.weight`` with ``X.weight_scale`` becomes
``w · scale``; a float8 ``X.weight`` with a block-wise ``X.weight_scale_inv`` (Hugging Face's
fp8 checkpoints: one factor per 128 × 128 tile, or ``weight_block_size`` in ``config.json``)
becomes ``w · scale_inv`` tile by tile. The pair is then judged by the metrics of engine/numerics/metrics.py against
the ``[weights.<kind>]`` limits of engine/thresholds.toml, ``kind`` being how the target was
made: ``exact`` (same dtype), ``fp16``/``bf16`` (a cast), ``int8``, ``fp8``; ``--thresholds
FILE`` overrides those tables as it overrides compare's.

One tensor pair is in memory at a time. Exit codes: 0 all pass, 1 a failure, 2 unusable input.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.outcome import EXIT_FINDING, EXIT_OK, check_report_path, write_object_report
from layerwatch.engine.readers.checkpoints import WeightEntry, WeightSet, open_weights
from layerwatch.engine.wording import note_lines

PREFIXES = ("_orig_mod.", "module.", "model.", "root.")
SCALE_SUFFIXES = ("_scale", "_offset", "_scale_inv")
BLOCK = 128
"""Hugging Face block-wise fp8 (DeepSeek-V3, Qwen3-FP8): one ``weight_scale_inv`` per 128 × 128
block unless ``config.json``'s ``quantization_config.weight_block_size`` says otherwise."""
GATES = ("cosine_similarity", "relative_euclidean_distance", "norm_relative_error")
PASS, FAIL, ERROR = "pass", "fail", "error"


def strip_prefixes(name: str) -> str:
    """``name`` without any leading wrapper prefixes (``module.model.x`` → ``x``)."""
    changed = True
    while changed:
        changed = False
        for prefix in PREFIXES:
            if name.startswith(prefix) and len(name) > len(prefix):
                name = name[len(prefix) :]
                changed = True
    return name


def weight_limits(thresholds: str | None = None) -> dict[str, dict[str, float]]:
    """The ``[weights.<kind>]`` tables of the packaged thresholds.toml, overlaid with the user's
    ``--thresholds`` file (validated and merged by engine/numerics/thresholds.py, like compare's)."""
    from layerwatch.engine.numerics.thresholds import Thresholds

    return Thresholds.load(thresholds).weights


@dataclass(slots=True)
class WeightRow:
    """One compared (or uncomparable) tensor pair."""

    name: str
    target_name: str
    matched_by: str
    kind: str
    golden_dtype: str
    golden_shape: tuple[int, ...]
    target_dtype: str
    target_shape: tuple[int, ...]
    golden_stats: tuple[float, float, float] | None = None
    target_stats: tuple[float, float, float] | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    verdict: str = PASS
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "target_name": self.target_name,
            "matched_by": self.matched_by,
            "kind": self.kind,
            "golden_dtype": self.golden_dtype,
            "golden_shape": list(self.golden_shape),
            "target_dtype": self.target_dtype,
            "target_shape": list(self.target_shape),
            "verdict": self.verdict,
            "reason": self.reason,
            "metrics": {k: _finite(v) for k, v in self.metrics.items()},
        }


def _finite(v: float) -> float | str:
    return v if math.isfinite(v) else str(v)


@dataclass(slots=True)
class WeightReport:
    rows: list[WeightRow]
    unmatched_golden: list[str]
    unmatched_target: list[str]
    notes: list[str]

    @property
    def failures(self) -> list[WeightRow]:
        return [r for r in self.rows if r.verdict != PASS]

    def to_json(self) -> dict[str, Any]:
        failures = self.failures
        return {
            "summary": {
                "compared": len(self.rows),
                "failed": len(failures),
                "unmatched_golden": len(self.unmatched_golden),
                "unmatched_target": len(self.unmatched_target),
            },
            "first_failure": failures[0].to_json() if failures else None,
            "failures": [r.name for r in failures],
            "unmatched_golden": self.unmatched_golden,
            "unmatched_target": self.unmatched_target,
            "notes": self.notes,
            "rows": [r.to_json() for r in self.rows],
        }


# -- matching -----------------------------------------------------------------------------


def _quant_parts(target: WeightSet) -> set[str]:
    """Target names that are scales/offsets of another target tensor (consumed by dequant)."""
    parts = set()
    for name in target.entries:
        for suffix in SCALE_SUFFIXES:
            if name.endswith(suffix) and name[: -len(suffix)] in target.entries:
                parts.add(name)
        # fp8 checkpoints carry the activation scale of a quantised Linear beside its weight
        if (
            name.endswith(".input_scale")
            and name[: -len("input_scale")] + "weight" in target.entries
        ):
            parts.add(name)
    return parts


def match(golden: WeightSet, target: WeightSet) -> tuple[list[tuple[str, str, str]], list, list]:
    """(golden name, target name, how) in golden order, then the unmatched names of each side."""
    parts = _quant_parts(target)
    free_t = [n for n in target.entries if n not in parts]
    free_t_set = set(free_t)
    pairs: dict[str, tuple[str, str]] = {}
    for g in golden.entries:
        if g in free_t_set:
            pairs[g] = (g, "name")
            free_t_set.discard(g)
    by_stripped: dict[str, list[str]] = {}
    for t in free_t:
        if t in free_t_set:
            by_stripped.setdefault(strip_prefixes(t), []).append(t)
    for g in golden.entries:
        if g in pairs:
            continue
        cands = by_stripped.get(strip_prefixes(g), [])
        if len(cands) == 1 and cands[0] in free_t_set:
            pairs[g] = (cands[0], "prefix")
            free_t_set.discard(cands[0])
    left_g = [g for g in golden.entries if g not in pairs]
    left_t = [t for t in free_t if t in free_t_set]
    for g, t in _by_fingerprint(golden, target, left_g, left_t):
        pairs[g] = (t, "fingerprint")
    order = [(g, *pairs[g]) for g in golden.entries if g in pairs]
    used = {t for _, t, _ in order}
    return (
        order,
        [g for g in golden.entries if g not in pairs],
        [t for t in free_t if t not in used],
    )


def _by_fingerprint(
    golden: WeightSet, target: WeightSet, left_g: list[str], left_t: list[str]
) -> Iterator[tuple[str, str]]:
    """Renamed tensors: the one unmatched target of the same shape whose norm and mean agree
    to 1 % (loads only the leftovers, one at a time)."""
    if not left_g or not left_t:
        return
    prints_t: dict[str, tuple[tuple[int, ...], float, float]] = {}
    for t in left_t:
        arr = _target_values(target, t)
        if arr is not None:
            prints_t[t] = (tuple(arr.shape), *_norm_mean(arr))
    taken: set[str] = set()
    for g in left_g:
        try:
            arr = _as_float(golden.entries[g].load())
        except Exception:  # an unreadable tensor stays unmatched
            continue
        shape, norm, mean = tuple(arr.shape), *_norm_mean(arr)
        cands = [
            t
            for t, (s, n, m) in prints_t.items()
            if t not in taken
            and s == shape
            and abs(n - norm) <= 0.01 * max(norm, 1e-30)
            and abs(m - mean) <= 0.01 * max(norm / math.sqrt(max(arr.size, 1)), 1e-30)
        ]
        if len(cands) == 1:
            taken.add(cands[0])
            yield g, cands[0]


def _norm_mean(arr: np.ndarray) -> tuple[float, float]:
    flat = arr.reshape(-1).astype(np.float64, copy=False)
    return float(np.sqrt(np.dot(flat, flat))), float(flat.mean()) if flat.size else 0.0


# -- values -------------------------------------------------------------------------------


def _as_float(value: Any) -> np.ndarray:
    """A float32 (or float64) numpy array of a torch tensor or numpy array."""
    from layerwatch.engine.numerics.arrays import to_numpy

    arr, _ = to_numpy(value)
    if arr.dtype.kind != "f" or arr.dtype.itemsize < 4:  # ints, fp16: float32 suffices
        arr = arr.astype(np.float32)
    return arr


def _target_values(target: WeightSet, name: str) -> np.ndarray | None:
    try:
        return dequantised(target, name)
    except Exception:
        return None


def dequantised(target: WeightSet, name: str) -> np.ndarray:
    """``name``'s values as floats; int8/fp8 with a ``_scale`` (and ``_offset``) dequantised,
    fp8 with a block-wise ``_scale_inv`` multiplied block by block (DeepSeek-V3's
    ``weight_dequant``: despite its name the factor multiplies)."""
    entry = target.entries[name]
    values = _as_float(entry.load())
    if not _quantised(entry.dtype):
        return values
    inv_e = target.entries.get(name + "_scale_inv")
    if inv_e is not None:
        scale_inv = _as_float(inv_e.load()).astype(np.float32)
        return values * _blockwise(scale_inv, values.shape, _block_size(target.path))
    scale_e = target.entries.get(name + "_scale")
    if scale_e is None:
        return values
    scale = _as_float(scale_e.load()).astype(np.float32)
    offset_e = target.entries.get(name + "_offset")
    if offset_e is not None:
        values = values - _channelwise(_as_float(offset_e.load()), values.ndim)
    return values * _channelwise(scale, values.ndim)


@functools.cache
def _block_size(path: str) -> tuple[int, int] | None:
    """``quantization_config.weight_block_size`` of the checkpoint's ``config.json``, if any."""
    config = (
        Path(path) / "config.json" if Path(path).is_dir() else Path(path).with_name("config.json")
    )
    try:
        block = json.loads(config.read_text(encoding="utf-8"))["quantization_config"][
            "weight_block_size"
        ]
        return int(block[0]), int(block[1])
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


def _blockwise(
    scale: np.ndarray, shape: tuple[int, ...], block: tuple[int, int] | None
) -> np.ndarray:
    """A per-block scale ``[ceil(out/b0), ceil(in/b1)]`` expanded to ``shape`` (one value: per
    tensor); a grid that does not tile the weight is an error, never a guess."""
    if scale.size == 1:
        return scale.reshape(())
    if len(shape) != 2 or scale.ndim != 2:
        raise ValueError(f"block scale of shape {list(scale.shape)} for a weight {list(shape)}")
    b0, b1 = block or (BLOCK, BLOCK)
    rows, cols = -(-shape[0] // b0), -(-shape[1] // b1)
    if scale.shape != (rows, cols):
        raise ValueError(
            f"weight_scale_inv {list(scale.shape)} does not tile a weight {list(shape)} in"
            f" {b0}×{b1} blocks (expected {[rows, cols]})"
        )
    full = np.repeat(np.repeat(scale, b0, axis=0), b1, axis=1)
    return full[: shape[0], : shape[1]]


def _quantised(dtype: str) -> bool:
    return dtype in ("int8", "uint8", "int4") or dtype.startswith("float8")


def _channelwise(v: np.ndarray, ndim: int) -> np.ndarray:
    """A scale of one value or one per output channel (``[out]`` or ``[out, 1]``), broadcastable."""
    if v.size == 1:
        return v.reshape(())
    return v.reshape((-1,) + (1,) * max(ndim - 1, 0))


def target_kind(golden_dtype: str, target: WeightEntry, has_scale: bool) -> str:
    """Which ``[weights.<kind>]`` limits judge the pair."""
    if target.dtype in ("int8", "uint8") and has_scale:
        return "int8"
    if target.dtype.startswith("float8"):
        return "fp8"
    if target.dtype == golden_dtype:
        return "exact"
    if target.dtype == "bfloat16":
        return "bf16"
    if target.dtype == "float16":
        return "fp16"
    if golden_dtype in ("bfloat16", "float16") and target.dtype in ("float32", "float64"):
        return "bf16" if golden_dtype == "bfloat16" else "fp16"  # an up-cast keeps the values
    return "exact"


def _stats(arr: np.ndarray) -> tuple[float, float, float] | None:
    if not arr.size:
        return None
    return float(arr.max()), float(arr.min()), float(arr.mean(dtype=np.float64))


def compare_one(
    golden: WeightSet,
    target: WeightSet,
    g_name: str,
    t_name: str,
    how: str,
    limits: dict[str, dict[str, float]],
) -> WeightRow:
    """Load one pair, dequantise the target, measure it and judge it; frees both on return."""
    from layerwatch.engine.numerics.arrays import compare_arrays

    ge, te = golden.entries[g_name], target.entries[t_name]
    kind = target_kind(
        ge.dtype, te, any(t_name + s in target.entries for s in ("_scale", "_scale_inv"))
    )
    row = WeightRow(g_name, t_name, how, kind, ge.dtype, ge.shape, te.dtype, te.shape)
    try:
        g = _as_float(ge.load())
        t = dequantised(target, t_name)
    except Exception as exc:  # a corrupt tensor inside a readable file
        row.verdict, row.reason = ERROR, f"unreadable: {str(exc).strip()[:160]}"
        return row
    row.golden_stats, row.target_stats = _stats(g), _stats(t)
    if g.shape != t.shape:
        row.verdict = FAIL
        row.reason = f"shape {list(g.shape)} vs {list(t.shape)}"
        if sorted(g.shape) == sorted(t.shape):
            row.reason += " (transposed?)"
        return row
    row.metrics = compare_arrays(g, t, rel_floor=1e-6)
    row.verdict, row.reason = judge(row.metrics, limits.get(kind, limits.get("exact", {})))
    return row


def judge(metrics: dict[str, float], limits: dict[str, float]) -> tuple[str, str]:
    """FAIL with the first gate out of its limit (NaN counts as out), else PASS."""
    if metrics.get("nonfinite_mismatch", 0.0):
        return FAIL, "NaN/Inf where golden has none"
    cos_min = limits.get("cosine_similarity")
    cos = metrics.get("cosine_similarity", float("nan"))
    if cos_min is not None and not cos >= cos_min:
        return FAIL, f"cosine_similarity {cos:.6f} < {cos_min}"
    for name in ("relative_euclidean_distance", "norm_relative_error"):
        limit = limits.get(name)
        value = metrics.get(name, float("nan"))
        if limit is not None and not value <= limit:
            return FAIL, f"{name} {value:.3g} > {limit}"
    return PASS, ""


def compare_weights(
    golden_path: str, target_path: str, thresholds: str | None = None
) -> WeightReport:
    """Match and compare every tensor of two sides (see the module docstring); ``thresholds``:
    a TOML file whose ``[weights.<kind>]`` tables override the packaged limits."""
    limits = weight_limits(thresholds)  # a bad file is one line before anything is read
    golden = open_weights(golden_path)
    target = open_weights(target_path)
    pairs, left_g, left_t = match(golden, target)
    notes = [f"golden: {n}" for n in golden.notes] + [f"target: {n}" for n in target.notes]
    if not pairs:
        raise LayerwatchError(
            f"nothing to compare: no tensor name of {golden_path} matches {target_path}"
            + (f" ({'; '.join(notes)})" if notes else "")
        )
    rows = [compare_one(golden, target, g, t, how, limits) for g, t, how in pairs]
    return WeightReport(rows, left_g, left_t, notes)


# -- output -------------------------------------------------------------------------------

CSV_COLUMNS = (
    "weight_name",
    "golden_dtype",
    "golden_shape",
    "golden_max_value",
    "golden_min_value",
    "golden_mean_value",
    "my_dtype",
    "my_shape",
    "my_max_value",
    "my_min_value",
    "my_mean_value",
    "cosine_similarity",
    "max_relative_error",
    "mean_relative_error",
    "max_absolute_error",
    "mean_absolute_error",
    "kl_divergence",
    "relative_euclidean_distance",
    "target_name",
    "matched_by",
    "kind",
    "norm_relative_error",
    "verdict",
    "reason",
)
"""msit ``compare -w``'s columns, then ours."""


def write_csv(report: WeightReport, out: Any) -> None:
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in report.rows:
        gs = r.golden_stats or ("", "", "")
        ts = r.target_stats or ("", "", "")
        m = r.metrics
        writer.writerow(
            [r.name, r.golden_dtype, list(r.golden_shape), *gs, r.target_dtype]
            + [list(r.target_shape), *ts]
            + [m.get(k, "") for k in CSV_COLUMNS[11:18]]
            + [r.target_name, r.matched_by, r.kind, m.get("norm_relative_error", "")]
            + [r.verdict, r.reason]
        )


def summary_lines(report: WeightReport) -> list[str]:
    failures = report.failures
    lines = [
        f"weights: {len(report.rows)} compared · {len(failures)} failed"
        f" · {len(report.unmatched_golden)} only in golden"
        f" · {len(report.unmatched_target)} only in target"
    ]
    lines += [f"FAIL {r.name} ({r.kind}): {r.reason}" for r in failures[:20]]
    if len(failures) > 20:
        lines.append(f"... and {len(failures) - 20} more")
    for side, names in (("golden", report.unmatched_golden), ("target", report.unmatched_target)):
        if names:
            shown = ", ".join(names[:10]) + (" ..." if len(names) > 10 else "")
            lines.append(f"only in {side}: {shown}")
    lines += note_lines(report.notes)
    return lines


def weights_main(args: argparse.Namespace) -> int:
    check_report_path(args.output)
    report = compare_weights(args.golden, args.target, getattr(args, "thresholds", None))
    if args.output:
        write_object_report(args.output, report.to_json(), lambda out: write_csv(report, out))
    if args.json:
        sys.stdout.write(json.dumps(report.to_json(), indent=1) + "\n")
    else:
        print("\n".join(summary_lines(report)))
    unreadable_side = any(
        "unreadable" in n or "missing" in n or "refused" in n for n in report.notes
    )
    return EXIT_FINDING if report.failures or unreadable_side else EXIT_OK
