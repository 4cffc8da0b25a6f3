"""Plain records every part of the engine shares: tensor keys and locations, topology, verdicts.

No numpy or torch import here: readers, the session, the reports and the TUI all pass these
around, and the TUI must be able to hold them without pulling in numerics.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

# --- metric names --------------------------------------------------------------------------
# msit's seven report columns keep msit's names so existing habits and scripts carry over.
COSINE = "cosine_similarity"
MAX_REL = "max_relative_error"
MEAN_REL = "mean_relative_error"
MAX_ABS = "max_absolute_error"
MEAN_ABS = "mean_absolute_error"
KL = "kl_divergence"
RED = "relative_euclidean_distance"
MSIT_METRICS = (COSINE, MAX_REL, MEAN_REL, MAX_ABS, MEAN_ABS, KL, RED)

# Ours, beyond msit.
ONE_THOUSANDTH = "one_thousandth_err_ratio"
"""Share of elements whose relative error is below 1e-3 (msprobe's 双千指标)."""
FIVE_THOUSANDTHS = "five_thousandths_err_ratio"
NAN_MISMATCH = "nonfinite_mismatch"
"""Number of positions where NaN/Inf differ between golden and target (0 = same positions)."""
NAN_GOLDEN = "nan_golden"
NAN_TARGET = "nan_target"
INF_GOLDEN = "inf_golden"
INF_TARGET = "inf_target"
TOP1 = "top1_agreement"
"""Logits only: share of rows whose argmax agrees."""
TOPK = "topk_overlap"
"""Logits only: mean overlap of the top-k index sets (k in the thresholds file)."""
MARGIN = "golden_top2_margin"
"""Logits only: largest golden top-1 minus top-2 logit among rows whose argmax disagrees
(the most confident flip; 0.0 when every row agrees). Smaller is better: a flip within noise
is a near-tie, not a fault."""
NORM_REL = "norm_relative_error"
"""|‖target‖ − ‖golden‖| / ‖golden‖ over the finite elements: a pure scale error, which cosine
cannot see and which random rounding noise barely moves (≈ RED²/2)."""
EXACT = "exact_match_ratio"
"""Integer/bool pairs only: share of elements that are exactly equal."""
LOCAL = "local_error"
"""Outputs only: the error the operator introduces beyond its inputs', as a share of its
allowance (engine/numerics/local.py); above 1.0 the operator fails. Absent when the node's
inputs were not captured."""
INPUT_ERR = "input_error"
"""Outputs only: the largest relative Euclidean distance among the node's float inputs (the
error that came in from upstream), next to ``local_error``."""
STAT_METRICS = (
    "max_stat_relative_error",
    "min_stat_relative_error",
    "mean_stat_relative_error",
    "l2norm_stat_relative_error",
    "max_stat_absolute_error",
    "min_stat_absolute_error",
    "mean_stat_absolute_error",
    "l2norm_stat_absolute_error",
)
"""Statistics-only pairs (msit ``-st`` column names): errors of max/min/mean/L2 norm."""

GRID_METRICS = (COSINE, RED, MAX_ABS, MEAN_REL, LOCAL)
"""Metrics the grid can colour by (``m`` cycles them); each cell keeps the worst value."""
HIGHER_IS_BETTER = frozenset({COSINE, ONE_THOUSANDTH, FIVE_THOUSANDTHS, TOP1, TOPK, EXACT})


# --- keys and locations --------------------------------------------------------------------
_STEM = re.compile(r"^(input|output)(?:_(.+))?$")


@functools.lru_cache(maxsize=1 << 16)
def stem_part(stem: str) -> str:
    """``"input"`` or ``"output"`` for an msit-style file stem (``input_0``, ``output``, ...).
    Remembered (a regex match; a run's stems are the same few, asked for a pair at a time when
    a token settles)."""
    match = _STEM.match(stem)
    if match is None:
        raise ValueError(f"not a tensor stem: {stem!r}")
    return match.group(1)


class TensorKey(NamedTuple):
    """Identifies one tensor of one run: (token, node, stem, rank).

    ``stem`` is msit's file stem: ``output`` for a single output, ``output_0``/``output_1_0`` for
    nested tuples, ``input_0`` for positional inputs, ``input_<name>`` for keyword inputs and
    ``output_<field>`` for dict/dataclass outputs.

    A named tuple: a key is hashed and compared ~50 times in its life (reader, session, pairing
    dicts and sets), and a tuple does both in C. The frozen dataclass of before, even with its
    hash cached, paid a Python call for each hash and each equality test of two equal keys
    (a dict lookup 0.59 µs against 0.08, built in 1.4 µs against 0.6; ~10 % of a small-tensor
    compare). Hash, equality and order are the fields' tuple's, as they were; ``_replace``
    makes a changed copy (``dataclasses.replace`` did).
    """

    token: int
    node: str
    stem: str
    rank: int = 0

    @property
    def part(self) -> str:
        return stem_part(self.stem)

    def label(self) -> str:
        rank = f" rank {self.rank}" if self.rank else ""
        return f"token {self.token}{rank} · {self.node} · {self.stem}"


@dataclass(frozen=True, slots=True)
class Locator:
    """Where a tensor's bytes are: everything a loader needs, picklable for worker processes.

    Every supported format resolves to raw little-endian bytes at an offset in a file (our
    safetensors batches, an ATB ``.bin`` payload, a storage record inside a torch zip, an
    ``.npy``), so loading is one read and a numpy view.
    """

    path: str
    offset: int
    nbytes: int
    dtype: str
    """Storage dtype name: ``float32 float16 bfloat16 float64 int8 uint8 int16 int32 int64 bool``..."""
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None = None
    """Element strides when the stored view is not C-contiguous (torch.save keeps views)."""
    elem_offset: int = 0
    """Offset in elements of the view inside the stored buffer."""
    layout: str = ""
    """``""`` for plain; ``"nz"`` for Ascend FRACTAL_NZ bytes to un-block into ``shape``."""
    stored_shape: tuple[int, ...] = ()
    """Shape of the bytes as stored, when it differs from ``shape`` (NZ blocks)."""


def slot_setters(cls: type) -> tuple[Callable[[Any, Any], None], ...]:
    """Each slot's setter of a frozen ``slots=True`` dataclass, in field order: they bypass the
    frozen ``__setattr__``, so a hot path builds one of its objects slot by slot
    (:func:`plain_locator`, :func:`plain_stats`, ``numerics/local.py`` ``_figure``)."""
    return tuple(getattr(cls, name).__set__ for name in vars(cls)["__slots__"])


_SLOT_SETS = slot_setters(Locator)


def plain_locator(
    path: str, offset: int, nbytes: int, dtype: str, shape: tuple[int, ...]
) -> Locator:
    """``Locator(path, offset, nbytes, dtype, shape)``, its other fields at their defaults, with
    its slots set directly: the frozen dataclass's ``__init__`` pays an ``object.__setattr__``
    call a field (2.7 µs against ~1.4; a reader builds one a tensor line). The same object
    as the constructor's (``tests/engine/test_intake_paths.py``)."""
    loc = object.__new__(Locator)
    s = _SLOT_SETS
    s[0](loc, path)
    s[1](loc, offset)
    s[2](loc, nbytes)
    s[3](loc, dtype)
    s[4](loc, shape)
    s[5](loc, None)
    s[6](loc, 0)
    s[7](loc, "")
    s[8](loc, ())
    return loc


@dataclass(frozen=True, slots=True)
class Stats:
    """Statistics of one tensor, over its finite elements; NaN/Inf counted separately."""

    max: float
    min: float
    mean: float
    norm: float
    nan: int = 0
    inf: int = 0


_STATS_SLOTS = slot_setters(Stats)


def plain_stats(high: float, low: float, mean: float, norm: float, nan: int, inf: int) -> Stats:
    """``Stats(high, low, mean, norm, nan, inf)`` with its slots set directly, as
    :func:`plain_locator` does: a small pair's compare makes two (each side's, ~1 µs each by
    the frozen ``__init__``), a reader one a tensor line with statistics. The same object as
    the constructor's (``tests/engine/test_pair_rate_paths.py``)."""
    stats = object.__new__(Stats)
    s = _STATS_SLOTS
    s[0](stats, high)
    s[1](stats, low)
    s[2](stats, mean)
    s[3](stats, norm)
    s[4](stats, nan)
    s[5](stats, inf)
    return stats


@dataclass(slots=True)
class TensorRecord:
    """One tensor of one run, as a reader found it. ``loc`` is ``None`` for statistics-only dumps."""

    key: TensorKey
    dtype: str
    shape: tuple[int, ...]
    loc: Locator | None
    stats: Stats | None = None
    order: int = -1
    """Completion order of the node at this token (-1: unknown, the topology decides)."""
    node_type: str = ""
    source: str = ""
    """File the tensor came from, for reports and the operator view."""


# --- topology ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ParamPrint:
    """A cheap fingerprint of one parameter, for pairing modules by identical weights.

    Taken once when hooks are registered (float64 sums over the parameter cast to float32, and
    its first values), so golden fp32 and target bf16 weights that are equal after a cast can
    be matched without dumping the weights themselves.
    """

    shape: tuple[int, ...]
    dtype: str
    sum: float
    abs_sum: float
    norm: float
    head: tuple[float, ...] = ()
    """The first (up to 16) values in C order, as float."""


@dataclass(slots=True)
class Node:
    name: str
    type: str = ""
    parent: str | None = None
    children: list[str] = field(default_factory=list)
    order: int = -1
    """Completion order at the reference token (forward-hook order; inner before outer)."""
    params: dict[str, ParamPrint] = field(default_factory=dict)
    """Direct parameters of this module (not its children's), by local name (``weight``)."""
    cls: str = ""
    """Qualified class (``torch.nn.modules.linear.Linear``), or the ATB op type; ``""`` when the
    dump does not say (older layerwatch dumps)."""
    attrs: dict[str, Any] = field(default_factory=dict)
    """Scalar attributes recomputation needs (eps, approximate, dim, ``has_bias``...) or an ATB
    op's parameters; empty when the dump does not record them."""


@dataclass(slots=True)
class Topology:
    """The module tree of a run, with execution (completion) order where the format has it."""

    nodes: dict[str, Node] = field(default_factory=dict)
    root: str = "root"

    def add(self, name: str, type_: str = "", parent: str | None = None, order: int = -1) -> Node:
        node = self.nodes.get(name)
        if node is None:
            node = self.nodes[name] = Node(name, type_, parent, [], order)
        else:
            node.type = node.type or type_
            node.parent = node.parent if node.parent is not None else parent
            if order >= 0:
                node.order = order
        if parent is not None:
            parent_node = self.nodes.get(parent) or self.add(parent)
            if name not in parent_node.children:
                parent_node.children.append(name)
        return node


# --- verdicts ------------------------------------------------------------------------------
class Verdict(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    DIVERGED = "diverged"
    """The target was fed different input ids from an earlier token on: not blamed."""
    UNPAIRED = "unpaired"
    ERROR = "error"
    """Unreadable, shape mismatch... ``reason`` says which."""


@dataclass(slots=True)
class PairResult:
    """The comparison of one golden tensor with its target counterpart.

    Truthy when the pair is within thresholds, like Polygraphy's compare results.
    ``metrics`` uses msit's column names (see the constants above); values are floats.
    """

    key: TensorKey
    """Golden-side key (the target key when the tensor exists only in the target)."""
    verdict: Verdict
    metrics: dict[str, float] = field(default_factory=dict)
    failed: tuple[str, ...] = ()
    """Names of the metrics outside their threshold."""
    reason: str = ""
    golden: TensorRecord | None = None
    target: TensorRecord | None = None
    order: int = -1
    node_type: str = ""
    block: int = -1
    """Index of the grid column (block) the node belongs to; -1 while unknown."""
    is_logits: bool = False
    golden_stats: Stats | None = None
    """Statistics of the golden tensor gathered by the compare pass when its record carries none
    and they were asked for (``layerwatch compare -o``: msit's max/min/mean columns)."""
    target_stats: Stats | None = None
    """The same for the target tensor."""

    def __bool__(self) -> bool:
        return self.verdict is Verdict.PASS

    def to_json(self) -> dict[str, Any]:
        """The row shape of ``layerwatch compare --json`` (keep these names stable)."""
        return {
            "token": self.key.token,
            "node": self.key.node,
            "tensor": self.key.stem,
            "rank": self.key.rank,
            "verdict": self.verdict.value,
            "metrics": dict(self.metrics),
            "reason": self.reason,
        }
