"""A single-card golden against a tensor-parallel target: the golden as each rank should see it.

The session pairs records by key, rank included. A golden captured on one card has rank 0
only; a TP target has ranks 0..W-1 (``rank{r}/`` directories, or one of them given alone).
:func:`spread_golden` gives the golden one record per target rank before the session sees it:

* a *replicated* tensor (same shape on the rank as in the golden: embeddings, the row-parallel
  output after its all-reduce, norms, logits) is the golden record itself, under rank r;
* a *sharded* tensor (a column-parallel output, a row-parallel input) is the golden's slice
  along the one dim where the rank's shape differs: the ranks' sizes along that dim add up to
  the golden's, rank r's slice starts after ranks 0..r-1's (equal shards when some rank is
  missing: ``size × world_size``). Comparing every rank's shard with its slice is comparing the
  concatenation of the shards with the golden, and a fault is found at its rank. The slice is a
  strided view of the golden's bytes (:class:`~layerwatch.engine.records.Locator` strides), no copy;
* a ``[[shard]]`` rule of the mapping file (``pattern`` on node names, ``dim`` or
  ``"replicated"``) decides instead of the shapes (:func:`shard_rules`).

A reduction's input on a rank is a partial sum, never the golden's value: the target's
``all_reduce``/``reduce_scatter_tensor`` inputs are left out (``layerwatch allreduce`` checks
them), and collective nodes the golden does not have (it ran without ``torch.distributed``)
too; one note says how many. A module that ran a reduction (a row-parallel Linear) is a matmul
*and* a cross-rank sum in another order: not one operator, so its type becomes
``RowParallelLinear+all_reduce`` on both sides and the local verdict, calibrated for one kernel
(``engine/numerics/local.py``: a kind it does not know has no local limit), leaves it to the
global limits.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.records import Locator, TensorRecord

COLLECTIVES = frozenset(
    {
        "all_reduce",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_single",
        "reduce_scatter_tensor",
        "reduce_scatter_single",
        "broadcast",
    }
)
"""Node types ``capture/collectives.py`` gives collective calls."""
PARTIAL_INPUTS = frozenset({"all_reduce", "reduce_scatter_tensor", "reduce_scatter_single"})


@dataclass(frozen=True)
class ShardRule:
    """Node names matching ``pattern`` are sharded along ``dim`` (``None``: replicated)."""

    pattern: re.Pattern[str]
    dim: int | None


def shard_rules(path: str | Path | None) -> list[ShardRule]:
    """The ``[[shard]]`` rules of a mapping file (TOML or JSON); ``[]`` without one."""
    if path is None or Path(path).is_dir():
        return []
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError:
        return []  # load_mapping reports an unreadable file
    try:
        if p.suffix.lower() == ".toml":
            import tomllib

            data = tomllib.loads(text)
        else:
            data = json.loads(text)
    except ValueError:
        return []
    items = data.get("shard", []) if isinstance(data, dict) else []
    rules = []
    for i, item in enumerate(items if isinstance(items, list) else []):
        dim = item.get("dim") if isinstance(item, dict) else None
        if (
            not isinstance(item, dict)
            or "pattern" not in item
            or not (dim == "replicated" or (isinstance(dim, int) and not isinstance(dim, bool)))
        ):
            raise LayerwatchError(
                f"mapping file {p}: shard rule {i + 1} needs 'pattern' and 'dim' "
                '(a dimension number or "replicated")'
            )
        try:
            pattern = re.compile(str(item["pattern"]))
        except re.error as exc:
            raise LayerwatchError(f"mapping file {p}: shard rule {i + 1}: {exc}") from None
        rules.append(ShardRule(pattern, None if dim == "replicated" else int(dim)))
    return rules


def world_size(path: str | Path) -> int | None:
    """The ``world_size`` a layerwatch dump's manifests record (its ranks or the rank given)."""
    root = Path(path)
    manifests = [root / "manifest.json"] if (root / "manifest.json").is_file() else []
    if not manifests and root.is_dir():
        manifests = sorted(root.glob("*/manifest.json"))
    sizes = []
    for m in manifests:
        try:
            obj = json.loads(m.read_bytes())
        except (OSError, ValueError):
            continue
        if isinstance(obj, dict) and isinstance(obj.get("world_size"), int):
            sizes.append(obj["world_size"])
    return max(sizes) if sizes else None


def wants_spread(golden: list[TensorRecord], target: list[TensorRecord], world: int | None) -> bool:
    """A golden of one rank (0) against a target of other or several ranks, or of a TP job."""
    g_ranks = {r.key.rank for r in golden}
    t_ranks = {r.key.rank for r in target}
    return g_ranks <= {0} and bool(t_ranks) and (t_ranks != {0} or (world or 1) > 1)


def spread_golden(
    golden: list[TensorRecord],
    target: list[TensorRecord],
    world: int | None,
    rules: list[ShardRule] | None = None,
) -> tuple[list[TensorRecord], list[TensorRecord], list[str]]:
    """(golden records per target rank, target records to compare, notes): the module docstring."""
    rules = rules or []
    by_name: dict[tuple[int, str, str], TensorRecord] = {
        (r.key.token, r.key.node, r.key.stem): r for r in golden
    }
    golden_nodes = {r.key.node for r in golden}
    groups: dict[tuple[int, str, str], dict[int, TensorRecord]] = defaultdict(dict)
    kept: list[TensorRecord] = []
    dropped = partial = 0
    reducers = {
        r.key.node.rsplit(".", 2)[0]: r.node_type for r in target if r.node_type in PARTIAL_INPUTS
    }
    for rec in target:
        kind = rec.node_type
        if kind in COLLECTIVES:
            if rec.key.node not in golden_nodes:
                dropped += 1
                continue
            if kind in PARTIAL_INPUTS and rec.key.stem.startswith("input"):
                partial += 1
                continue
        if rec.key.node in reducers:
            rec = replace(rec, node_type=f"{rec.node_type}+{reducers[rec.key.node]}")
        kept.append(rec)
        groups[(rec.key.token, rec.key.node, rec.key.stem)][rec.key.rank] = rec
    ranks_seen = {r.key.rank for r in kept}
    world = max(world or 0, max(ranks_seen, default=0) + 1)
    out: list[TensorRecord] = []
    used: set[tuple[int, str, str]] = set()
    sharded = 0
    for name, members in groups.items():
        g = by_name.get(name)
        if g is None:
            continue
        used.add(name)
        if name[1] in reducers:
            g = replace(g, node_type=f"{g.node_type}+{reducers[name[1]]}")
        for rank, t in members.items():
            view = _view(g, t, rank, members, world, rules)
            sharded += view is not g
            out.append(view if view.key.rank == rank else _as_rank(view, rank))
    out.extend(g for name, g in by_name.items() if name not in used)  # unpaired, as rank 0
    notes = []
    if sharded:
        notes.append(
            f"target is tensor parallel ({world} ranks): {sharded} sharded tensors compared "
            "with their slice of the golden"
        )
    if partial:
        notes.append(
            f"{partial} all-reduce inputs of the target are partial sums: not compared with the "
            "single-card golden (layerwatch allreduce checks them)"
        )
    if dropped:
        notes.append(
            f"{dropped} tensors of collective calls the golden does not have were left out "
            "(layerwatch allreduce checks them)"
        )
    return out, kept, notes


def _as_rank(record: TensorRecord, rank: int) -> TensorRecord:
    return replace(record, key=replace(record.key, rank=rank))


def _view(
    g: TensorRecord,
    t: TensorRecord,
    rank: int,
    members: dict[int, TensorRecord],
    world: int,
    rules: list[ShardRule],
) -> TensorRecord:
    """The golden record rank ``rank``'s tensor ``t`` is compared with (``g`` or a slice)."""
    gs, ts = tuple(g.shape), tuple(t.shape)
    rule = next((r for r in rules if r.pattern.search(g.key.node)), None)
    if rule is not None:
        if rule.dim is None:
            return g
        dim = rule.dim % len(gs) if gs else 0
    else:
        if gs == ts or len(gs) != len(ts):
            return g
        diff = [i for i, (a, b) in enumerate(zip(gs, ts, strict=True)) if a != b]
        if len(diff) != 1:
            return g
        dim = diff[0]
    if (
        len(gs) != len(ts)
        or not gs
        or any(a != b for i, (a, b) in enumerate(zip(gs, ts, strict=True)) if i != dim)
    ):
        return g
    start = _start(dim, gs[dim], rank, members, world)
    if start is None or start + ts[dim] > gs[dim]:
        return g
    return _slice(g, dim, start, ts)


def _start(
    dim: int, full: int, rank: int, members: dict[int, TensorRecord], world: int
) -> int | None:
    """Where rank ``rank``'s shard starts along ``dim``: after the lower ranks' shards when every
    rank's tensor is here and their sizes add up to the golden's, else ``rank × size`` for equal
    shards (a missing or truncated rank); ``None`` when neither fits."""
    sizes = {r: tuple(m.shape)[dim] if len(m.shape) > dim else -1 for r, m in members.items()}
    if set(sizes) == set(range(world)) and sum(sizes.values()) == full:
        return sum(sizes[r] for r in range(rank))
    size = sizes[rank]
    if size * world == full:
        return rank * size
    return None


def _slice(g: TensorRecord, dim: int, start: int, shape: tuple[int, ...]) -> TensorRecord:
    loc = g.loc
    if loc is None or loc.layout or loc.strides is not None:
        return g  # statistics only, NZ blocks or a stored view: compared whole (a shape error)
    strides = [1] * len(g.shape)
    for i in range(len(g.shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * int(g.shape[i + 1])
    itemsize = loc.nbytes // max(1, math.prod(g.shape))
    view = Locator(
        loc.path,
        loc.offset,
        math.prod(shape) * itemsize,
        loc.dtype,
        tuple(shape),
        tuple(strides),
        loc.elem_offset + start * strides[dim],
    )
    return replace(g, shape=tuple(shape), loc=view, stats=None)
