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

from layerwatch.capture import format as lwf
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.readers.base import ReaderUpdate
from layerwatch.engine.records import Locator, TensorRecord

COLLECTIVES = frozenset(lwf.COLLECTIVE_TYPES)
PARTIAL_INPUTS = frozenset(lwf.REDUCTION_TYPES)


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


def spread_for(
    golden: str | Path, target: str | Path, rules: list[ShardRule] | None = None
) -> RankSpread | None:
    """A :class:`RankSpread` when the dumps on disk are a single card against a TP job (the
    target's manifests say ``world_size`` > 1, the golden's do not); ``None`` otherwise (also
    while a launched target has written nothing yet: then ranks pair by number)."""
    t_world = world_size(target)
    if (t_world or 1) <= 1 or (world_size(golden) or 1) > 1:
        return None
    return RankSpread(t_world, rules)


def wants_spread(golden: list[TensorRecord], target: list[TensorRecord], world: int | None) -> bool:
    """A golden of one rank (0) against a target of other or several ranks, or of a TP job."""
    g_ranks = {r.key.rank for r in golden}
    t_ranks = {r.key.rank for r in target}
    return g_ranks <= {0} and bool(t_ranks) and (t_ranks != {0} or (world or 1) > 1)


def spread_updates(
    golden: ReaderUpdate, target: ReaderUpdate, world: int | None, mapping: str | Path | None
) -> bool:
    """:func:`spread_golden` on two finished dumps' updates, in place, when the golden is a
    single card against ranks of a tensor-parallel target (``mapping``: the ``--map`` file's
    ``[[shard]]`` rules); False (nothing changed) otherwise."""
    if not wants_spread(golden.tensors, target.tensors, world):
        return False
    golden.tensors, target.tensors, notes = spread_golden(
        golden.tensors, target.tensors, world, shard_rules(mapping)
    )
    target.notes.extend(notes)
    return True


def spread_golden(
    golden: list[TensorRecord],
    target: list[TensorRecord],
    world: int | None,
    rules: list[ShardRule] | None = None,
) -> tuple[list[TensorRecord], list[TensorRecord], list[str]]:
    """(golden records per target rank, target records to compare, notes) of two finished
    dumps: the module docstring (:meth:`RankSpread.spread_all`)."""
    spread = RankSpread(world, rules)
    g_out, t_out = spread.spread_all(golden, target)
    return g_out, t_out, spread.take_notes()


class RankSpread:
    """:func:`spread_golden` for records arriving in any order and batches (the live pipeline).

    ``feed(side, records)`` and ``finish(side)`` return ``(golden records, target records)`` to
    hand to the session now. A golden record waits for the target records of its name; a target
    collective record waits for the golden's end (does the golden have that node?); a sharded
    tensor whose slice needs ranks not seen yet waits for them or for the target's end.
    """

    def __init__(self, world: int | None, rules: list[ShardRule] | None = None) -> None:
        self.world = world or 1
        self.rules = rules or []
        self._golden: dict[Name, TensorRecord] = {}
        self._golden_nodes: set[str] = set()
        self._target: dict[Name, dict[int, TensorRecord]] = defaultdict(dict)
        self._emitted: set[tuple[Name, int]] = set()
        self._matched: set[Name] = set()
        self._waiting_collectives: list[TensorRecord] = []
        self._reducers: dict[str, str] = {}
        self._done = {"golden": False, "target": False}
        self._counts = {"sharded": 0, "partial": 0, "dropped": 0}
        self._notes: list[str] = []

    def feed(self, side: str, records: list[TensorRecord]) -> Batch:
        g_out: list[TensorRecord] = []
        t_out: list[TensorRecord] = []
        if side == "golden":
            for rec in records:
                name = _name(rec)
                self._golden[name] = rec
                self._golden_nodes.add(rec.key.node)
                if name in self._target:
                    g_out += self._views(name, final=self._done["target"])
                elif self._done["target"]:
                    g_out.append(rec)  # nothing of the target will pair with it: unpaired
        else:
            for rec in records:  # a batch's reductions first: their module may come before
                if rec.node_type in PARTIAL_INPUTS:
                    self._reducers[rec.key.node.rsplit(".", 2)[0]] = rec.node_type
            for rec in records:
                self._take_target(rec, g_out, t_out)
        return g_out, t_out

    def finish(self, side: str) -> Batch:
        """``side`` sends nothing more: release what waited on it."""
        if self._done[side]:
            return [], []
        self._done[side] = True
        g_out: list[TensorRecord] = []
        t_out: list[TensorRecord] = []
        if side == "golden":
            waiting, self._waiting_collectives = self._waiting_collectives, []
            for rec in waiting:
                self._take_target(rec, g_out, t_out)
        else:
            for name in list(self._target):
                if name in self._golden:
                    g_out += self._views(name, final=True)
            g_out += [g for name, g in self._golden.items() if name not in self._matched]
            self._matched.update(self._golden)
        if all(self._done.values()):
            self._summarise()
        return g_out, t_out

    def spread_all(self, golden: list[TensorRecord], target: list[TensorRecord]) -> Batch:
        """Both sides' whole record lists, both finished: what :func:`spread_golden` and
        :class:`WindowSpread` hand the session. The target goes first, so uneven shards see
        every rank."""
        g_out: list[TensorRecord] = []
        t_out: list[TensorRecord] = []
        for side, records in (("target", target), ("golden", golden)):
            got = self.feed(side, records)
            g_out += got[0]
            t_out += got[1]
        for side in ("golden", "target"):
            got = self.finish(side)
            g_out += got[0]
            t_out += got[1]
        return g_out, t_out

    def take_notes(self) -> list[str]:
        notes, self._notes = self._notes, []
        return notes

    def _take_target(
        self, rec: TensorRecord, g_out: list[TensorRecord], t_out: list[TensorRecord]
    ) -> None:
        kind = rec.node_type
        if kind in COLLECTIVES:
            if kind in PARTIAL_INPUTS and rec.key.stem.startswith("input"):
                self._counts["partial"] += 1
                return
            if not self._done["golden"]:
                self._waiting_collectives.append(rec)
                return
            if rec.key.node not in self._golden_nodes:
                self._counts["dropped"] += 1
                return
        reducer = self._reducers.get(rec.key.node)
        if reducer is not None:
            rec = replace(rec, node_type=f"{rec.node_type}+{reducer}")
        name = _name(rec)
        self.world = max(self.world, rec.key.rank + 1)
        self._target[name][rec.key.rank] = rec
        t_out.append(rec)
        if name in self._golden:
            g_out += self._views(name, final=self._done["target"])

    def _views(self, name: Name, *, final: bool) -> list[TensorRecord]:
        """The golden views of ``name`` for its target ranks not given one yet."""
        g = self._golden[name]
        self._matched.add(name)
        reducer = self._reducers.get(name[1])
        if reducer is not None:
            g = replace(g, node_type=f"{g.node_type}+{reducer}")
        members = self._target[name]
        out = []
        for rank, t in members.items():
            if (name, rank) in self._emitted:
                continue
            view = _view(g, t, rank, members, self.world, self.rules)
            if view is None:
                if not final:
                    continue  # its slice depends on ranks not here yet
                view = g
            self._emitted.add((name, rank))
            self._counts["sharded"] += view.shape != g.shape
            out.append(view if view.key.rank == rank else _as_rank(view, rank))
        return out

    def _summarise(self) -> None:
        self._notes.extend(count_notes(self._counts, self.world))


def count_notes(counts: dict[str, int], world: int) -> list[str]:
    """What a spread did, in one note a kind (sharded, partial sums, collectives left out)."""
    notes = []
    if counts["sharded"]:
        notes.append(
            f"target is tensor parallel ({world} ranks): {counts['sharded']} sharded "
            "tensors compared with their slice of the golden"
        )
    if counts["partial"]:
        notes.append(
            f"{counts['partial']} all-reduce inputs of the target are partial sums: not "
            "compared with the single-card golden (layerwatch allreduce checks them)"
        )
    if counts["dropped"]:
        notes.append(
            f"{counts['dropped']} tensors of collective calls the golden does not have were "
            "left out (layerwatch allreduce checks them)"
        )
    return notes


class WindowSpread:
    """:func:`spread_updates` for a compare read a window of tokens at a time
    (engine/session/windowed.py): each window is spread on its own — a name carries its token,
    so no slice waits on another window — and the notes count over the whole run."""

    def __init__(self, world: int | None, mapping: str | Path | None) -> None:
        self.world = world
        self.rules = shard_rules(mapping)
        self.counts = {"sharded": 0, "partial": 0, "dropped": 0}
        self.spread_world = 0
        self.ranks: set[int] = set()
        """Target ranks with tensors, in the windows that were spread."""

    def __call__(self, golden: ReaderUpdate, target: ReaderUpdate) -> None:
        if not wants_spread(golden.tensors, target.tensors, self.world):
            return
        spread = RankSpread(self.world, self.rules)
        g_out, t_out = spread.spread_all(golden.tensors, target.tensors)
        self.ranks.update(r.key.rank for r in t_out)
        golden.tensors, target.tensors = g_out, t_out
        for kind, n in spread._counts.items():
            self.counts[kind] += n
        self.spread_world = max(self.spread_world, spread.world)

    def notes(self, target: str) -> list[str]:
        """The run's spread notes, then the ranks of ``target`` that had no tensors at all."""
        if not self.spread_world:
            return []
        out = count_notes(self.counts, self.spread_world)
        world = self.world or 0
        missing = sorted(set(range(world)) - self.ranks)
        return out + [f"rank {r} of {world} has no tensors in {target}" for r in missing]


Name = tuple[int, str, str]
Batch = tuple[list[TensorRecord], list[TensorRecord]]


def _name(record: TensorRecord) -> Name:
    return (record.key.token, record.key.node, record.key.stem)


def _as_rank(record: TensorRecord, rank: int) -> TensorRecord:
    return replace(record, key=record.key._replace(rank=rank))


def _view(
    g: TensorRecord,
    t: TensorRecord,
    rank: int,
    members: dict[int, TensorRecord],
    world: int,
    rules: list[ShardRule],
) -> TensorRecord | None:
    """The golden record rank ``rank``'s tensor ``t`` is compared with (``g`` or a slice);
    ``None`` when the slice depends on ranks not seen yet."""
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
    if start is None:
        return None if len(members) < world else g
    if start + ts[dim] > gs[dim]:
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
