"""Thresholds: which metric values pass, per dtype class, with per-node overrides.

The limits live in one documented TOML file, ``engine/thresholds.toml`` (packaged); a user
file given with ``--thresholds`` overlays it key by key (unknown keys are an error naming
the key). A metric listed for a class *gates* the verdict; every other metric is
informational (reported, never fails a pair). The thresholds file says why each number is
what it is (the calibration measurements).
"""

from __future__ import annotations

import copy
import fnmatch
import functools
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.numerics.local import LocalLimit, op_kind
from layerwatch.engine.numerics.threshold_schema import (
    CLASS_LABEL,
    CLASSES,
    OVERRIDE_KEYS,
    dtype_class,
    looser,
    validate,
)
from layerwatch.engine.records import (
    COSINE,
    HIGHER_IS_BETTER,
    INF_GOLDEN,
    INF_TARGET,
    LOCAL,
    MARGIN,
    NAN_GOLDEN,
    NAN_MISMATCH,
    NAN_TARGET,
    STAT_METRICS,
    TOP1,
    Verdict,
)

if TYPE_CHECKING:
    from layerwatch.engine.seam import MetricCheck

__all__ = ["CLASSES", "Override", "Thresholds", "dtype_class", "fmt_value", "looser"]

_MEMO_LIMIT = 4096
"""Entries of :attr:`Thresholds._memo` before it starts over (a dump's distinct nodes × stems)."""
HIGHER = HIGHER_IS_BETTER
"""Metrics where a larger value is better (the rest: smaller is better)."""
LABEL = {COSINE: "cosine", NAN_MISMATCH: "NaN/Inf mismatch"}


@dataclass(frozen=True, slots=True)
class Override:
    """Limits for nodes matching a glob (later overrides win)."""

    node: str
    tensor: str = "*"
    dtype: str | None = None
    logits: bool | None = None
    limits: dict[str, float | None] = field(default_factory=dict)


@dataclass(slots=True)
class Thresholds:
    """Parsed thresholds. Plain data: picklable for worker processes."""

    floors: dict[str, float]
    limits: dict[str, dict[str, float | None]]
    logits: dict[str, dict[str, float | None]]
    statistics: dict[str, dict[str, float | None]]
    overrides: list[Override]
    topk: int = 5
    source: str = "defaults"
    local: dict[str, dict[str, LocalLimit]] = field(default_factory=dict)
    """``[local.<class>]``: limits of the local verdict per operator kind (numerics/local.py)."""
    weights: dict[str, dict[str, float]] = field(default_factory=dict)
    """``[weights.<kind>]``: gates of ``layerwatch weights`` per target kind (engine/weights.py);
    a gate set to ``false`` by the user is dropped."""
    _memo: dict[tuple[Any, ...], tuple[str, dict[str, float], dict[str, str]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """:meth:`_limits_of`'s answers: a compare asks once a pair, for the same few (node, stem,
    dtypes) on every token (~9 µs a pair of dict building and glob matching). Read-only
    results; a copy (``dataclasses.replace``) starts empty."""

    # -- loading -------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | None = None) -> Thresholds:
        """The packaged defaults, overlaid with the user's TOML file at ``path`` if given."""
        raw = copy.deepcopy(_default_raw())
        if path is None:
            return _parse(raw, "defaults")
        tomllib = _toml()
        try:
            with open(path, "rb") as fh:
                user = tomllib.load(fh)
        except OSError as exc:
            raise LayerwatchError(f"cannot read thresholds file {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise LayerwatchError(f"thresholds file {path} is not valid TOML: {exc}") from None
        validate(user, path)
        for key, value in user.items():
            if key == "override":
                raw.setdefault("override", []).extend(value)
            elif isinstance(value, dict):
                _merge(raw.setdefault(key, {}), value)
            else:
                raw[key] = value
        return _parse(raw, path)

    @classmethod
    def default(cls) -> Thresholds:
        return _default()

    # -- lookups -------------------------------------------------------------------------
    def floor(self, golden_dtype: str, target_dtype: str) -> float:
        """Small-value floor of the relative error for this pair's dtype class."""
        return self.floors[looser(golden_dtype, target_dtype)]

    def limits_for(
        self,
        *,
        node: str,
        golden_dtype: str,
        target_dtype: str,
        is_logits: bool = False,
        stem: str = "",
        statistics: bool = False,
    ) -> tuple[str, dict[str, float], dict[str, str]]:
        """(dtype class, gating metric → limit, metric → the override glob that set it)."""
        klass = looser(golden_dtype, target_dtype)
        if statistics:
            limits = dict(self.statistics.get(klass, {}))
        else:
            limits = dict(self.limits.get(klass, {}))
            if is_logits:
                limits.update(self.logits.get(klass, {}))
        origin: dict[str, str] = {}
        for ov in self.overrides:
            if (
                fnmatch.fnmatchcase(node, ov.node)
                and fnmatch.fnmatchcase(stem or "output", ov.tensor)
                and ov.dtype in (None, klass)
                and ov.logits in (None, is_logits)
            ):
                limits.update(ov.limits)
                origin.update(dict.fromkeys(ov.limits, ov.node))
        return klass, {k: v for k, v in limits.items() if v is not None}, origin

    # -- judging -------------------------------------------------------------------------
    def local_limit(self, klass: str, node_type: str) -> LocalLimit | None:
        """The local-verdict limits of an operator (None: its class has no local limits)."""
        table = self.local.get(klass)
        if not table:
            return None
        return table.get(op_kind(node_type))

    def _limits_of(
        self,
        metrics: dict[str, float],
        node: str,
        golden_dtype: str,
        target_dtype: str,
        is_logits: bool,
        stem: str,
    ) -> tuple[str, dict[str, float], dict[str, str]]:
        """:meth:`limits_for` of a pair's metrics (statistics-only pairs use their own
        section), remembered: the dicts returned are shared, never to be changed."""
        statistics = not metrics.keys().isdisjoint(STAT_METRICS)  # any of them, in C
        key = (
            (node, stem, golden_dtype, target_dtype, is_logits, statistics)
            if self.overrides  # the node and stem only matter to overrides
            else (golden_dtype, target_dtype, is_logits, statistics)
        )
        found = self._memo.get(key)
        if found is None:
            if len(self._memo) >= _MEMO_LIMIT:
                self._memo.clear()
            found = self._memo[key] = self.limits_for(
                node=node,
                golden_dtype=golden_dtype,
                target_dtype=target_dtype,
                is_logits=is_logits,
                stem=stem,
                statistics=statistics,
            )
        return found

    def checks(
        self,
        metrics: dict[str, float],
        *,
        node: str,
        golden_dtype: str,
        target_dtype: str,
        is_logits: bool = False,
        stem: str = "",
    ) -> list[MetricCheck]:
        """Every metric in ``metrics`` against its limit (``limit=None``: informational)."""
        from layerwatch.engine.seam import MetricCheck  # a drill-in's (engine/seam_detail.py)

        _, limits, _ = self._limits_of(metrics, node, golden_dtype, target_dtype, is_logits, stem)
        out = []
        for name, value in metrics.items():
            limit = 1.0 if name == LOCAL else limits.get(name)
            op = ">=" if name in HIGHER else "<="
            passed = True if limit is None else _within(name, value, limit, metrics, limits)
            out.append(MetricCheck(name, value, limit, op, passed))
        return out

    def judge(
        self,
        metrics: dict[str, float],
        *,
        node: str,
        golden_dtype: str,
        target_dtype: str,
        is_logits: bool = False,
        stem: str = "",
    ) -> tuple[Verdict, tuple[str, ...], str]:
        """(verdict, failed metric names, one readable line saying why)."""
        klass, limits, origin = self._limits_of(
            metrics, node, golden_dtype, target_dtype, is_logits, stem
        )
        failed = []
        for name, limit in limits.items():  # _within, its plain cases inline (~6 calls a pair)
            value = metrics.get(name)
            if value is None:
                continue
            kind = _KIND.get(name, 0)
            if kind == 0:
                ok = value <= limit  # NaN fails both ways
            elif kind == 1:
                ok = (1.0 - value) <= (1.0 - limit)
            elif kind == 2:
                ok = value >= limit
            else:
                ok = _within(name, value, limit, metrics, limits)
            if not ok:
                failed.append(name)
        if not failed:
            return Verdict.PASS, (), ""
        parts = [_describe(name, metrics, limits) for name in failed if name != MARGIN]
        label = CLASS_LABEL[klass] + (" logits" if is_logits else "")
        statistics = any(name in metrics for name in STAT_METRICS)
        label += " statistics limits" if statistics else " limits"
        for glob in dict.fromkeys(origin[name] for name in failed if name in origin):
            label += f", override {glob}"
        return Verdict.FAIL, tuple(failed), f"{' and '.join(parts)} ({label})"


_KIND = {
    **dict.fromkeys(HIGHER, 2),
    COSINE: 1,
    TOP1: 3,
    MARGIN: 3,
}
"""How :func:`_within` compares each metric: 0 ``<=``, 1 cosine (on ``1 - cos``), 2 ``>=``, 3
top-1 and margin (together)."""


def _within(
    name: str,
    value: float,
    limit: float,
    metrics: dict[str, float],
    limits: Mapping[str, float],
) -> bool:
    if name in (TOP1, MARGIN):
        # A top-1 flip fails only when the golden run was confident about the row it flipped.
        top1_ok = metrics.get(TOP1, 1.0) >= limits.get(TOP1, 0.0)
        margin_limit = limits.get(MARGIN)
        margin_ok = margin_limit is None or metrics.get(MARGIN, 0.0) <= margin_limit
        return top1_ok or (margin_ok and MARGIN in limits)
    if name in HIGHER:
        if name == COSINE:  # judge on 1 - cos so the comparison keeps its digits
            return (1.0 - value) <= (1.0 - limit)
        return value >= limit
    return value <= limit  # NaN fails both ways


def _describe(name: str, metrics: dict[str, float], limits: Mapping[str, float]) -> str:
    value = metrics[name]
    if name == NAN_MISMATCH:
        nan_g, inf_g = int(metrics.get(NAN_GOLDEN, 0)), int(metrics.get(INF_GOLDEN, 0))
        nan_t, inf_t = int(metrics.get(NAN_TARGET, 0)), int(metrics.get(INF_TARGET, 0))
        if nan_g + inf_g == 0:
            return f"target has {nan_t} NaN and {inf_t} Inf where golden is finite"
        return (
            f"NaN/Inf positions differ at {int(value)} elements "
            f"(golden {nan_g} NaN {inf_g} Inf, target {nan_t} NaN {inf_t} Inf)"
        )
    if name == TOP1:
        margin = metrics.get(MARGIN, math.nan)
        text = f"top-1 agreement {fmt_value(name, value)} < {limits[name]:g}"
        if MARGIN in limits:
            text += f" with golden top-2 margin {margin:.3g} > {limits[MARGIN]:g}"
        return text
    op = "<" if name in HIGHER else ">"
    return f"{LABEL.get(name, name)} {fmt_value(name, value)} {op} {limits[name]:g}"


def fmt_value(name: str, value: float) -> str:
    """A metric value with the digits that matter: 0.99871 and 0.999994 stay apart."""
    if name in HIGHER and 0.0 < 1.0 - value < 1.0:
        digits = max(4, math.ceil(-math.log10(1.0 - value)) + 2)
        return f"{value:.{digits}f}".rstrip("0")
    if math.isfinite(value) and value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.3g}"


# -- TOML ------------------------------------------------------------------------------------
def _toml() -> Any:
    """The TOML parser, imported when a file is parsed (not when the parsed defaults are
    loaded from the cache: :func:`_remembered`)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10: the same parser, as a package
        import tomli as tomllib
    return tomllib


@functools.cache
def _default_raw() -> dict[str, Any]:
    packaged = Path(__file__).parent.parent / "thresholds.toml"
    if packaged.is_file():  # installed as files: no importlib.resources (~8 ms of start-up)
        text = packaged.read_text(encoding="utf-8")
    else:  # a zipped install
        from importlib import resources

        text = (
            resources.files("layerwatch.engine")
            .joinpath("thresholds.toml")
            .read_text(encoding="utf-8")
        )
    raw = _remembered(text)
    if raw is None:
        raw = _toml().loads(text)
        validate(raw, "thresholds.toml")
        _remember(text, raw)
    return raw


def _parsed_path(text: str) -> Path:
    """Where the parsed packaged defaults are kept: beside the compiled metric kernel
    (numerics/fused.py ``cache_dir``), named by the text's CRC and length and the Python."""
    import zlib

    from layerwatch.engine.numerics.fused import cache_dir

    data = text.encode()
    crc = zlib.crc32(data)
    version = f"{sys.version_info[0]}{sys.version_info[1]}"
    return cache_dir() / f"thresholds-{crc:08x}-{len(data)}-py{version}.marshal"


def _remembered(text: str) -> dict[str, Any] | None:
    """The packaged defaults as parsed and validated by an earlier process, or None. Parsing
    the TOML cost 7–11 ms of every compare's start-up (pure-Python ``tomllib``); ``marshal``
    loads the same plain dict (str, int, float, bool, list, dict) in ~0.1 ms."""
    import marshal

    try:
        raw = marshal.loads(_parsed_path(text).read_bytes())
    except (OSError, ValueError, EOFError, TypeError):
        return None
    return raw if isinstance(raw, dict) else None


def _remember(text: str, raw: dict[str, Any]) -> None:
    """Keep the parsed defaults for later processes (best effort: a read-only cache only means
    the next process parses again)."""
    import marshal

    from layerwatch.capture.atomic import replacing

    path = _parsed_path(text)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with replacing(path, unique=True) as tmp:
            Path(tmp).write_bytes(marshal.dumps(raw))
    except (OSError, ValueError):
        pass


@functools.cache
def _default() -> Thresholds:
    return Thresholds.load()


def _merge(base: dict[str, Any], top: dict[str, Any]) -> None:
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


def _limit(value: Any) -> float | None:
    return None if value is False else float(value)


def _parse(raw: dict[str, Any], source: str) -> Thresholds:
    logits = raw.get("logits", {})
    return Thresholds(
        floors={k: float(v) for k, v in raw.get("floor", {}).items()},
        limits={c: {m: _limit(v) for m, v in t.items()} for c, t in raw.get("limits", {}).items()},
        logits={c: {m: _limit(v) for m, v in t.items()} for c, t in logits.items() if c in CLASSES},
        statistics={
            c: {m: _limit(v) for m, v in t.items()} for c, t in raw.get("statistics", {}).items()
        },
        overrides=[
            Override(
                node=ov["node"],
                tensor=ov.get("tensor", "*"),
                dtype=ov.get("dtype"),
                logits=ov.get("logits"),
                limits={m: _limit(v) for m, v in ov.items() if m not in OVERRIDE_KEYS},
            )
            for ov in raw.get("override", [])
        ],
        topk=int(logits.get("topk", 5)),
        source=source,
        local={
            c: {k: LocalLimit(**{n: float(v) for n, v in e.items()}) for k, e in t.items()}
            for c, t in raw.get("local", {}).items()
        },
        weights={
            kind: {m: float(v) for m, v in table.items() if v is not False}
            for kind, table in raw.get("weights", {}).items()
        },
    )
