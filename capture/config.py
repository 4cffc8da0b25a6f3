"""``DumpConfig``: what to capture and where, with msit's parameter names and meanings.

A plain dataclass (msit's is a silent process-wide singleton): two configs are two objects, and
``register_hook(model, config)`` may be called once per model. Arguments are validated here so a
mistake surfaces as a one-line :class:`LayerwatchError` before anything runs.

Differences from msit, on purpose:

* ``token_range=None`` (the default) dumps **every** token (msit: ``[0]``, prefill only): finding
  the first bad token needs all of them. msit's list still works, as do ``range(0, 8)`` and
  spec strings such as ``"0-7,12"`` or ``"8-"``.
* ``dump_statistics_mode`` defaults to 2 (tensors *and* statistics; msit: 0) for the layerwatch
  format: statistics are computed on the device in batches and let a viewer show NaN/Inf counts
  before loading data. With ``format="msit"`` the default stays msit's 0.
* ``layer_name`` is an ``fnmatch`` glob (or a list of globs) on node names; msit only knows ``*``.
* ``format="msit"`` writes msit's ``.pth`` layout instead of the default layerwatch format.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from .cases import read_case_keys
from .errors import LayerwatchError
from .golden import GoldenTokens, read_golden
from .tokens import TokenSelection

FORMATS = ("layerwatch", "msit")
MiB = 1 << 20


@dataclass
class DumpConfig:
    """What to dump. Field names and meanings follow msit's ``DumpConfig`` (msit.md §1.1)."""

    dump_path: str | os.PathLike[str] = "./"
    """Root directory; layerwatch writes ``{dump_path}/{device}_{pid}/``, msit format
    ``{dump_path}/msit_dump_{YYYYMMDD_HHMMSS}/torch_tensors/{device}_{pid}/``."""
    token_range: Any = None
    """Tokens to dump: ``None`` = all (msit: prefill only), a list, a ``range`` or ``"0-7,12"``."""
    module_list: Sequence[type] = ()
    """If non-empty, only modules that are instances of one of these classes are dumped."""
    tensor_part: int = 2
    """0 = inputs only, 1 = outputs only, 2 = both."""
    device_id: int | None = None
    """If set and the model is not on the CPU, dump only when it is on device ``device_id``."""
    dump_statistics_mode: int | None = None
    """0 = tensors only, 1 = statistics only (no payload leaves the device), 2 = both.
    ``None``: 2 for the layerwatch format, 0 (msit's default) for ``format="msit"``."""
    dump_last_logits: bool = False
    """Dump only the logits: the output of the last leaf module returning a float tensor."""
    dump_weight: bool = False
    """Write every (selected) parameter once, at ``register_hook`` time."""
    layer_name: str | Sequence[str] | None = None
    """Glob (``fnmatch``) or list of globs on node names (``root.layers.*.attention*``)."""
    seed: int | None = None
    """If set, ``register_hook`` calls ``seed_all(seed)`` first."""
    format: str = "layerwatch"
    """``"layerwatch"`` (safetensors batches + index) or ``"msit"`` (one ``.pth`` per tensor)."""
    mode: str | Sequence[str] = "module"
    """msit compatibility: only ``"module"`` is supported (msit's API dumps are never compared)."""
    api_list: Sequence[Any] = ()
    """msit compatibility: must stay empty."""
    dump_weights: bool | None = None
    """Alias of ``dump_weight`` (the spelling of issue texts and msprobe)."""
    queue_bytes: int = 512 * MiB
    """Bound on bytes copied but not yet written; the model thread waits when it is reached."""
    batch_bytes: int = 64 * MiB
    """A data file is closed once its batch holds this many bytes."""
    flush_interval: float = 0.05
    """Seconds after which pending tensors are written even if the batch is small (live view)."""
    keep_tokens: int | None = None
    """Statistics-first: payloads stay only for the last ``keep_tokens`` tokens and the tokens
    around an anomaly (NaN/Inf/saturation); every tensor's statistics stay (capture/keep.py).
    ``None``: keep every payload."""
    follow: str | os.PathLike[str] | None = None
    """A golden layerwatch dump to follow (teacher forcing): at each step the target is fed the
    golden's token (``capture/follow.py``). Read and checked here, before anything runs."""
    cases: Any = None
    """Per-case capture of only these cases: a list of keys, or a JSON file (``layerwatch
    badcase --json``'s output: its ``bad_cases``). ``None``: every token."""
    case_keys: frozenset[str] | None = field(init=False, repr=False, default=None)
    golden: GoldenTokens | None = field(init=False, repr=False, default=None)
    """``follow``'s token ids, per token."""
    tokens: TokenSelection = field(init=False, repr=False)
    """``token_range`` parsed; ``__contains__`` answers "is token t dumped"."""

    def __post_init__(self) -> None:
        self.tokens = TokenSelection.of(self.token_range)
        if self.dump_weights is not None:
            self.dump_weight = bool(self.dump_weights)
        if not isinstance(self.dump_path, str | os.PathLike) or not str(self.dump_path):
            raise LayerwatchError(f"dump_path must be a directory path, got {self.dump_path!r}")
        _choice("tensor_part", self.tensor_part, (0, 1, 2))
        _choice("format", self.format, FORMATS)
        if self.dump_statistics_mode is None:
            self.dump_statistics_mode = 0 if self.format == "msit" else 2
        _choice("dump_statistics_mode", self.dump_statistics_mode, (0, 1, 2))
        if self.device_id is not None and (
            not isinstance(self.device_id, int)
            or isinstance(self.device_id, bool)
            or self.device_id < 0
        ):
            raise LayerwatchError(
                f"device_id must be a device number >= 0 or None, got {self.device_id!r}"
            )
        if self.seed is not None and (
            not isinstance(self.seed, int) or isinstance(self.seed, bool)
        ):
            raise LayerwatchError(f"seed must be an int or None, got {self.seed!r}")
        self.module_list = _types(self.module_list)
        self.layer_name = _globs(self.layer_name)
        modes = (self.mode,) if isinstance(self.mode, str) else tuple(self.mode)
        if set(modes) - {"module"} or list(self.api_list):
            raise LayerwatchError(
                "mode='api'/api_list is not supported: layerwatch captures every module's inputs "
                "and outputs (msit's API dumps overwrite repeated calls and are never compared)"
            )
        for name in ("queue_bytes", "batch_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise LayerwatchError(f"{name} must be a positive number of bytes, got {value!r}")
        if not isinstance(self.flush_interval, int | float) or self.flush_interval <= 0:
            raise LayerwatchError(
                f"flush_interval must be > 0 seconds, got {self.flush_interval!r}"
            )
        if self.keep_tokens is not None:
            if (
                not isinstance(self.keep_tokens, int)
                or isinstance(self.keep_tokens, bool)
                or self.keep_tokens < 1
            ):
                raise LayerwatchError(f"keep_tokens must be >= 1 or None, got {self.keep_tokens!r}")
            if self.format != "layerwatch" or self.dump_statistics_mode != 2:
                raise LayerwatchError(
                    "keep_tokens (statistics-first) needs the layerwatch format with statistics "
                    "and tensors (dump_statistics_mode=2)"
                )
        for name in ("dump_last_logits", "dump_weight"):
            setattr(self, name, bool(getattr(self, name)))
        if self.follow is not None:
            if not isinstance(self.follow, str | os.PathLike) or not str(self.follow):
                raise LayerwatchError(f"follow must be a dump directory, got {self.follow!r}")
            self.golden = read_golden(self.follow)
        if self.cases is not None:
            self.case_keys = read_case_keys(self.cases)

    @property
    def path(self) -> Path:
        return Path(os.fsdecode(self.dump_path)).expanduser()

    @property
    def want_inputs(self) -> bool:
        return self.tensor_part in (0, 2) and not self.dump_last_logits

    @property
    def want_outputs(self) -> bool:
        return self.tensor_part in (1, 2) or self.dump_last_logits

    @property
    def want_payload(self) -> bool:
        return self.dump_statistics_mode in (0, 2)

    @property
    def want_stats(self) -> bool:
        return self.dump_statistics_mode in (1, 2)

    def selects(self, node: str, module: object) -> bool:
        """Whether the filters (``layer_name`` globs, ``module_list`` types) keep this node."""
        if self.module_list and not isinstance(module, tuple(self.module_list)):
            return False
        globs = self.layer_name
        return not globs or any(fnmatchcase(node, g) for g in globs)

    def describe(self) -> dict[str, Any]:
        """JSON-able summary for the manifest."""
        return {
            "token_range": _token_spec(self.tokens),
            "module_list": [t.__name__ for t in self.module_list],
            "tensor_part": self.tensor_part,
            "dump_statistics_mode": self.dump_statistics_mode,
            "dump_last_logits": self.dump_last_logits,
            "dump_weight": self.dump_weight,
            "layer_name": list(self.layer_name or ()),
            "device_id": self.device_id,
            "seed": self.seed,
            "format": self.format,
            "keep_tokens": self.keep_tokens,
            "follow": None if self.golden is None else str(self.golden.rank_dir),
            "cases": None if self.case_keys is None else sorted(self.case_keys),
        }


def _choice(name: str, value: object, allowed: tuple[object, ...]) -> None:
    if isinstance(value, bool) or value not in allowed:
        shown = ", ".join(repr(a) for a in allowed)
        raise LayerwatchError(f"{name} must be one of {shown}, got {value!r}")


def _types(value: object) -> tuple[type, ...]:
    if value is None:
        return ()
    items = (value,) if isinstance(value, type) else value
    try:
        types = tuple(items)  # type: ignore[arg-type]
    except TypeError:
        raise LayerwatchError(
            f"module_list must be a list of module classes, got {value!r}"
        ) from None
    bad = [t for t in types if not isinstance(t, type)]
    if bad:
        raise LayerwatchError(f"module_list must hold module classes, got {bad[0]!r}")
    return types


def _globs(value: object) -> tuple[str, ...] | None:
    if value is None or value == "":
        return None
    items = (value,) if isinstance(value, str) else value
    try:
        globs = tuple(items)  # type: ignore[arg-type]
    except TypeError:
        raise LayerwatchError(
            f"layer_name must be a glob or a list of globs, got {value!r}"
        ) from None
    if not globs or not all(isinstance(g, str) and g for g in globs):
        raise LayerwatchError(f"layer_name must be a glob or a list of globs, got {value!r}")
    return globs


def _token_spec(tokens: TokenSelection) -> str:
    parts = []
    for lo, hi in tokens.ranges:
        parts.append(f"{lo}-" if hi is None else (str(lo) if lo == hi else f"{lo}-{hi}"))
    return ",".join(parts)
