"""The thresholds file's vocabulary: dtype classes, which metric names each section takes,
and the validation that turns any unknown or malformed key into a one-line error naming it."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine import records as r

CLASSES = ("int", "fp32", "fp16", "bf16")
"""Dtype classes from strictest to loosest; a pair is judged by the looser of its two sides."""
CLASS_LABEL = {"int": "integer", "fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
NONFINITE_METRICS = frozenset(
    {r.NAN_MISMATCH, r.NAN_GOLDEN, r.NAN_TARGET, r.INF_GOLDEN, r.INF_TARGET}
)
"""NaN/Inf counts and position mismatches: judged in every section."""
TENSOR_METRICS = (
    frozenset({r.COSINE, r.MAX_REL, r.MEAN_REL, r.MAX_ABS, r.MEAN_ABS, r.RED, r.NORM_REL})
    | {r.ONE_THOUSANDTH, r.FIVE_THOUSANDTHS, r.EXACT}
    | NONFINITE_METRICS
)
LOGIT_METRICS = frozenset({r.KL, r.TOP1, r.TOPK, r.MARGIN})


@lru_cache(maxsize=512)  # a handful of dtype names, asked a few times per pair
def dtype_class(dtype: str) -> str:
    """``int``/``fp32``/``fp16``/``bf16`` for a dtype name from any reader or framework."""
    name = dtype.lower().removeprefix("torch.").removeprefix("dt_").removeprefix("acl_")
    if "bf16" in name or "bfloat16" in name or "float8" in name or "fp8" in name:
        return "bf16"  # fp8 has no class of its own yet: the loosest float limits apply
    if name in ("float16", "fp16", "half", "f16"):
        return "fp16"
    if name.startswith(("int", "uint", "bool", "long", "short", "char", "byte")):
        return "int"
    return "fp32"


@lru_cache(maxsize=512)
def looser(golden_dtype: str, target_dtype: str) -> str:
    return max(dtype_class(golden_dtype), dtype_class(target_dtype), key=CLASSES.index)


OVERRIDE_KEYS = frozenset({"node", "tensor", "dtype", "logits"})
SECTION_METRICS = {
    "limits": TENSOR_METRICS,
    "logits": TENSOR_METRICS | LOGIT_METRICS,
    "statistics": frozenset(r.STAT_METRICS) | NONFINITE_METRICS,
}
WEIGHT_KINDS = frozenset({"exact", "fp16", "bf16", "int8", "fp8"})
WEIGHT_METRICS = frozenset(
    {"cosine_similarity", "relative_euclidean_distance", "norm_relative_error"}
)
ALL_METRICS = TENSOR_METRICS | LOGIT_METRICS | SECTION_METRICS["statistics"]
LOCAL_KEYS = frozenset({"red_gain", "red", "scale_gain", "scale"})
"""Keys of one ``[local.<class>]`` entry (engine/numerics/local.py says what they mean)."""


def validate(raw: dict[str, Any], path: str) -> None:
    """Reject unknown keys and malformed values with a one-line message naming the key."""

    def bad(key: str, why: str = "unknown key") -> LayerwatchError:
        return LayerwatchError(f"thresholds file {path}: {why} '{key}'")

    def check_limit(key: str, value: Any) -> None:
        if value is not False and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise bad(key, "expected a number or false for")

    for key, value in raw.items():
        if key == "version":
            continue
        if key == "floor":
            for cls, v in _table(value, key, bad).items():
                if cls not in CLASSES:
                    raise bad(f"floor.{cls}")
                if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
                    raise bad(f"floor.{cls}", "expected a positive number for")
        elif key == "local":
            from layerwatch.engine.numerics.local import KINDS

            for cls, table in _table(value, key, bad).items():
                if cls not in CLASSES or cls == "int":
                    raise bad(f"local.{cls}")
                for kind, entry in _table(table, f"local.{cls}", bad).items():
                    if kind not in KINDS:
                        raise bad(f"local.{cls}.{kind}")
                    for name, v in _table(entry, f"local.{cls}.{kind}", bad).items():
                        where = f"local.{cls}.{kind}.{name}"
                        if name not in LOCAL_KEYS:
                            raise bad(where)
                        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
                            raise bad(where, "expected a non-negative number for")
                        if name in ("red", "scale") and v == 0:
                            raise bad(where, "expected a positive number for")
        elif key in SECTION_METRICS:
            for cls, table in _table(value, key, bad).items():
                if key == "logits" and cls == "topk":
                    if isinstance(table, bool) or not isinstance(table, int) or table < 1:
                        raise bad("logits.topk", "expected a positive integer for")
                    continue
                if cls not in CLASSES:
                    raise bad(f"{key}.{cls}")
                for metric, v in _table(table, f"{key}.{cls}", bad).items():
                    if metric not in SECTION_METRICS[key]:
                        raise bad(f"{key}.{cls}.{metric}")
                    check_limit(f"{key}.{cls}.{metric}", v)
        elif key == "override":
            if not isinstance(value, list):
                raise bad("override", "expected [[override]] tables for")
            for i, ov in enumerate(value):
                where = f"override[{i}]"
                if not isinstance(ov, dict) or not isinstance(ov.get("node"), str):
                    raise bad(f"{where}.node", "missing or non-string")
                for metric, v in ov.items():
                    if metric in ("node", "tensor"):
                        if not isinstance(v, str):
                            raise bad(f"{where}.{metric}", "expected a string for")
                    elif metric == "dtype":
                        if v not in CLASSES:
                            raise bad(f"{where}.dtype", f"expected one of {', '.join(CLASSES)} for")
                    elif metric == "logits":
                        if not isinstance(v, bool):
                            raise bad(f"{where}.logits", "expected true/false for")
                    elif metric not in ALL_METRICS:
                        raise bad(f"{where}.{metric}")
                    else:
                        check_limit(f"{where}.{metric}", v)
        elif key == "weights":  # `layerwatch weights` limits per target kind (engine/weights.py)
            for kind, table in _table(value, key, bad).items():
                if kind not in WEIGHT_KINDS:
                    raise bad(f"weights.{kind}")
                for metric, v in _table(table, f"weights.{kind}", bad).items():
                    if metric not in WEIGHT_METRICS:
                        raise bad(f"weights.{kind}.{metric}")
                    check_limit(f"weights.{kind}.{metric}", v)
        else:
            raise bad(key)


def _table(value: Any, key: str, bad: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad(key, "expected a table for")
    return value
