"""The session's bookkeeping: records of both runs, who pairs with whom, cells' members.

Kept apart from :mod:`.core` (the public API and the compare loop). Everything here runs
under the session's lock. Invariants:

- ``_pairs[g]`` exists iff the golden record ``g`` and at least one target record mapping to
  ``g`` exist; the target partner is the smallest such key (deterministic on collisions).
- ``_gonly``/``_tonly`` hold the records without a partner; they are *pending* until the other
  side finishes and UNPAIRED after.
- A pair's ``eff`` is recomputed whenever something it depends on changes (divergence, order,
  block, the raw result), and counts, failures and dirty cells follow from that one place.
"""

from __future__ import annotations

import operator
import threading
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from layerwatch.capture.tokens import TokenSelection
from layerwatch.engine.numerics.local import LocalFigure, embedding_input, local_figure, op_kind
from layerwatch.engine.numerics.logits import logits_shaped
from layerwatch.engine.numerics.threshold_schema import dtype_class, looser
from layerwatch.engine.records import (
    INPUT_ERR,
    LOCAL,
    Locator,
    PairResult,
    TensorKey,
    TensorRecord,
    Topology,
    Verdict,
)
from layerwatch.engine.seam import CellUpdate, Finding
from layerwatch.engine.session import findings
from layerwatch.engine.session.blocks import BlockLayout, layout_for, topology_from_names
from layerwatch.engine.session.cells import is_failure, same_cell
from layerwatch.engine.session.findings import part_of, stem_sort
from layerwatch.engine.session.settled import SettledTokens

if TYPE_CHECKING:
    from layerwatch.engine.numerics.thresholds import Thresholds
    from layerwatch.engine.session.pairing import Pairer

SIDES = ("golden", "target")
_INT32 = (-(1 << 31), 1 << 31)
_ORDER = operator.attrgetter("order")
SETTLE_LAG = 2
"""A token settles once both runs have records this many tokens past it (or finished): the
files of one token can land out of order (msit writes a directory per token), not two apart."""
Member = tuple[str, TensorKey]
"""``("g", golden key)`` for golden records (paired or not), ``("t", target key)`` for unpaired target records."""


@dataclass(slots=True)
class _Pair:
    """A golden record's key, its target partner's, and the raw and the reported result."""

    gkey: TensorKey
    tkey: TensorKey
    logits: bool = False
    raw: PairResult | None = None
    """What the compare function returned (before divergence is applied)."""
    eff: PairResult | None = None
    """What the session reports: ``raw`` with divergence, order and block applied."""


def _is_float(dtype: str) -> bool:
    return "float" in dtype


def _tiebreak(record: TensorRecord) -> tuple[object, ...]:
    loc = record.loc
    return (record.source, loc.path if loc else "", loc.offset if loc else -1, repr(record.stats))


class SessionState:
    pairer: Pairer
    tokens: TokenSelection
    thresholds: Thresholds

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._records: dict[str, dict[TensorKey, TensorRecord]] = {s: {} for s in SIDES}
        self._topo: dict[str, Topology | None] = {s: None for s in SIDES}
        self._token_ids: dict[str, dict[int, tuple[int, ...]]] = {s: {} for s in SIDES}
        self._weights: dict[str, dict[str, Locator]] = {s: {} for s in SIDES}
        self._finished = {s: False for s in SIDES}
        self._pairs: dict[TensorKey, _Pair] = {}
        self._todo: set[TensorKey] = set()
        self._tmap: dict[TensorKey, TensorKey | None] = {}
        self._by_g: dict[TensorKey, set[TensorKey]] = defaultdict(set)
        self._extra: dict[TensorKey, TensorKey] = {}
        """Leftover stem pairs found once both sides finished (target key → golden key)."""
        self._gonly: set[TensorKey] = set()
        self._tonly: set[TensorKey] = set()
        self._members: dict[tuple[int, int], set[Member]] = defaultdict(set)
        self._member_cell: dict[Member, tuple[int, int]] = {}
        self._node_keys: dict[tuple[int, int, str], set[TensorKey]] = defaultdict(set)
        self._fails: dict[int, set[TensorKey]] = defaultdict(set)
        """Failing pairs (FAIL/ERROR, not diverged) by token: the findings look at the earliest."""
        self._logits_fails: Counter[int] = Counter()
        self._counts: Counter[Verdict] = Counter()
        self._n_logits = 0
        self._dirty_cells: set[tuple[int, int]] = set()
        self._emitted: dict[tuple[int, int], CellUpdate] = {}
        """Cells as last sent, except settled cells shown as their row of
        ``settled.cells`` (most of a long session's: no object a cell)."""
        self._table_shown = True
        """The settled cells absent from ``_emitted`` were sent as they are (False after the
        grid's columns changed, until they are sent again)."""
        self._changed: set[Member] = set()
        self._first_failure: Finding | None = None
        self._root_cause: Finding | None = None
        self._first_bad_token: int | None = None
        self._first_bad_cell: tuple[int, int] | None = None
        self._findings_dirty = False
        self._layout = BlockLayout((), None)
        self._layout_topo: Topology | None = None
        self._blocks_changed = False
        self._gnodes: dict[str, tuple[str, int, int]] = {}
        """Golden node → (type, order, token of that order): a topology guess before the real one."""
        self._names_dirty = False
        self._tnodes: set[str] = set()
        self._token_filter = True
        """False when every token is selected (skips the per-record check)."""
        self._pairing_sizes = (0, 0)
        self._float_out: dict[str, int] = {}
        self._logits: tuple[str | None, int | None] = (None, None)
        self._diverge_at: int | None = None
        self._diverge_reason = ""
        self._struct_dirty = False
        self._divergence_dirty = False
        self._leftover_dirty = False
        self._notes: list[str] = []
        self._new_notes: list[str] = []
        self._note_set: set[str] = set()
        self.compact = False
        """Settle judged tokens into :attr:`settled` and forget their records (live sessions:
        ~200 bytes a pair instead of ~5 KB). Off for the headless compares, which drop whole
        sessions a window at a time (engine/session/windowed.py)."""
        self.settled = SettledTokens()
        self._n_settled = 0
        self._keys_at: dict[str, dict[int, set[TensorKey]]] = {s: defaultdict(set) for s in SIDES}
        """Live records by side and token (only when :attr:`compact`): what settling drops."""
        self._top = {s: -1 for s in SIDES}
        self._tokens_seen: dict[str, set[int]] = {s: set() for s in SIDES}
        self._reuse_at: dict[int, list[tuple[object, ...]]] = defaultdict(list)
        """Payload keys of ``_reuse`` (core.py) by token, dropped when the token settles."""

    @property
    def _logits_seen(self) -> bool:
        return self._n_logits > 0

    def _note(self, message: str) -> None:
        if message not in self._note_set:
            self._note_set.add(message)
            self._notes.append(message)
            self._new_notes.append(message)

    # --- records ---------------------------------------------------------------------------
    def _add_record(self, side: str, record: TensorRecord) -> None:
        key = record.key
        if self._token_filter and key.token not in self.tokens:
            return
        store = self._records[side]
        old = store.get(key)
        if old is not None:
            if (
                old.loc == record.loc
                and old.shape == record.shape
                and old.dtype == record.dtype
                and old.stats == record.stats
            ):
                return  # the same tensor reported twice
            self._note(
                f"{side}: {key.label()} was dumped twice with different data; keeping one deterministically"
            )
            if _tiebreak(record) >= _tiebreak(old):
                return
        if old is None and key.token in self.settled.ranges and self._is_settled(side, key):
            return  # reported again after its token settled: judged already
        store[key] = record
        self._leftover_dirty = True
        if old is None:
            self._tokens_seen[side].add(key.token)
            if key.token > self._top[side]:
                self._top[side] = key.token
            if self.compact:
                self._keys_at[side][key.token].add(key)
        if side == "golden":
            info = self._gnodes.get(key.node)
            if (
                info is None
                or key.token < info[2]
                or (key.token == info[2] and 0 <= record.order < info[1])
                or (not info[0] and record.node_type)
            ):
                self._gnodes[key.node] = (
                    record.node_type or (info[0] if info else ""),
                    record.order,
                    key.token,
                )
                self._names_dirty = True
            if part_of(key.stem) == "output" and _is_float(record.dtype) and record.shape:
                self._float_out.setdefault(key.node, record.shape[-1])
            if old is None:
                self._node_keys[(key.token, key.rank, key.node)].add(key)
                self._gonly.add(key)
                self._place(("g", key))
                if self._by_g.get(key):
                    self._sync(key)
            elif key in self._pairs:
                self._requeue(self._pairs[key])
        elif old is None:
            self._tnodes.add(key.node)
            self._map_target(key)
        else:
            gkey = self._tmap.get(key)
            pair = self._pairs.get(gkey) if gkey is not None else None
            if pair is not None and pair.tkey == key:
                self._requeue(pair)

    def _map_target(self, tkey: TensorKey) -> None:
        gkey = self._extra.get(tkey) or self.pairer.golden_key(tkey)
        if gkey is not None:  # the golden record's own key object where there is one: later
            # lookups then match by identity before comparing fields (~5 a pair)
            record = self._records["golden"].get(gkey)
            if record is not None:
                gkey = record.key
        self._tmap[tkey] = gkey
        if gkey is not None:
            self._by_g[gkey].add(tkey)
            if gkey in self._records["golden"]:
                pair = self._pairs.get(gkey)
                if pair is None or tkey < pair.tkey:
                    self._sync(gkey)  # pairs it now: never placed as a one-sided member
                    return
        self._tonly.add(tkey)
        self._place(("t", tkey))

    def _sync(self, gkey: TensorKey) -> None:
        """Make ``_pairs[gkey]`` agree with the records and the mapping."""
        cands = self._by_g.get(gkey)
        want = min(cands) if cands and gkey in self._records["golden"] else None
        pair = self._pairs.get(gkey)
        if pair is not None and pair.tkey == want:
            return
        if pair is not None:
            del self._pairs[gkey]
            self._todo.discard(gkey)
            self._drop_eff(pair)
            self._n_logits -= pair.logits
            self._tonly.add(pair.tkey)
            self._place(("t", pair.tkey))
            self._changed.add(("t", pair.tkey))
            self._gonly.add(gkey)
        if want is not None:
            self._gonly.discard(gkey)
            self._tonly.discard(want)
            tmember: Member = ("t", want)
            self._unplace(tmember)
            self._changed.discard(tmember)
            logits = self._want_logits(gkey)
            self._pairs[gkey] = _Pair(gkey, want, logits)
            self._n_logits += logits
            self._todo.add(gkey)
        member: Member = ("g", gkey)
        self._changed.add(member)
        self._dirty_member(member)

    def _requeue(self, pair: _Pair) -> None:
        self._drop_eff(pair)
        pair.raw = None
        self._todo.add(pair.gkey)
        self._dirty_member(("g", pair.gkey))

    def _finish(self, side: str) -> None:
        if self._finished[side]:
            return
        self._finished[side] = True
        self._leftover_dirty = True
        other = "g" if side == "target" else "t"
        for key in self._gonly if other == "g" else self._tonly:
            self._changed.add((other, key))
        self._dirty_cells.update(self._members)

    # --- settling (live sessions) -----------------------------------------------------------
    def _is_settled(self, side: str, key: TensorKey) -> bool:
        gkey = key if side == "golden" else self.pairer.golden_key(key)
        return gkey is not None and self.settled.holds(gkey)

    def _settleable(self, token: int) -> bool:
        """Nothing can change ``token``'s pairs any more: both runs are past it (or finished),
        its input ids are known (so a divergence cannot reach back to it), the pairing and the
        grid's columns rest on a topology, and every pair at it is judged. Unpaired tensors at
        it stay live (their partner may still come)."""
        if token in self.settled.ranges:
            return False
        for side in SIDES:
            if not self._finished[side] and self._top[side] < token + SETTLE_LAG:
                return False
        if any(self._token_ids.values()) and not all(
            self._finished[s] or token in self._token_ids[s] for s in SIDES
        ):
            return False
        if self._struct_dirty or self._names_dirty or self._divergence_dirty:
            return False
        if self._topo["golden"] is None and not all(self._finished.values()):
            return False
        for gkey in self._keys_at["golden"].get(token, ()):
            pair = self._pairs.get(gkey)
            if pair is not None and (pair.eff is None or gkey in self._todo):
                return False
        return True

    def _settle(self) -> None:
        """Hand every settleable token's judged pairs to :attr:`settled` (in token order,
        stopping at the first token that is not), dropping their records and results."""
        if not self.compact:
            return
        for token in sorted(self._keys_at["golden"]):
            if token in self.settled.ranges:
                continue  # its unpaired tensors (and late pairs) stay live
            if not self._settleable(token) or not self._settle_token(token):
                break

    def _settle_token(self, token: int) -> bool:
        gkeys = self._keys_at["golden"][token]
        pairs = [p for k in gkeys if (p := self._pairs.get(k)) is not None]
        results: list[PairResult] = [p.eff for p in pairs if p.eff is not None]
        orders = list(map(_ORDER, results))  # min/max in C, not a generator a pair
        if orders and not (_INT32[0] <= min(orders) and max(orders) < _INT32[1]):
            return False  # an order the store's int32 column cannot hold: stays live
        results.sort(key=findings.report_key)
        failures = [r for r in results if is_failure(r)]
        first = findings.first_failure(failures)
        cause = findings.root_cause(failures, self._inputs) if failures else None
        self.settled.add_token(token, results, first, cause)
        self._n_settled += len(results)
        golden, target = self._records["golden"], self._records["target"]
        tkeys = self._keys_at["target"].get(token)
        for pair in pairs:
            gkey, tkey = pair.gkey, pair.tkey
            del self._pairs[gkey]
            golden.pop(gkey, None)
            target.pop(tkey, None)
            gkeys.discard(gkey)
            if tkeys is not None:
                tkeys.discard(tkey)
            self._tmap.pop(tkey, None)
            cands = self._by_g.get(gkey)
            if cands is not None:
                cands.discard(tkey)
                if not cands:
                    del self._by_g[gkey]
            member: Member = ("g", gkey)
            where = self._member_cell.get(member)
            if where is not None:
                del self._member_cell[member]
                members = self._members[where]
                members.discard(member)
                if not members:
                    del self._members[where]
            self._changed.discard(member)
            node = (gkey.token, gkey.rank, gkey.node)
            same = self._node_keys.get(node)
            if same is not None:
                same.discard(gkey)
                if not same:
                    del self._node_keys[node]
        if not gkeys:
            del self._keys_at["golden"][token]
        if tkeys is not None and not tkeys:
            del self._keys_at["target"][token]
        self._fails.pop(token, None)
        for payload in self._reuse_at.pop(token, ()):
            self._reuse.pop(payload, None)  # type: ignore[attr-defined]
        for settled in self.settled.cells_of(token):
            cell = (token, settled.block)
            shown = self._emitted.get(cell)
            if cell in self._members:
                continue  # its live part (unpaired tensors) keeps the cell in ``_emitted``
            if shown is not None and not shown.first_bad and same_cell(shown, settled):
                del self._emitted[cell]  # shown as the settled table's row from now on
            else:
                self._dirty_cells.add(cell)
        return True

    # --- results ---------------------------------------------------------------------------
    def _order_of(self, side: str, record: TensorRecord) -> int:
        if record.order >= 0:
            return record.order
        topo = self._topo[side] if side == "target" else self._layout_topo
        node = topo.nodes.get(record.key.node) if topo is not None else None
        return node.order if node is not None else -1

    def _effective(self, pair: _Pair) -> PairResult:
        raw = pair.raw
        assert raw is not None
        golden = self._records["golden"][pair.gkey]
        target = self._records["target"][pair.tkey]
        if raw.golden is not None and raw.golden.shape != golden.shape:
            golden = raw.golden  # compared at the last position only (see align.py)
        if raw.target is not None and raw.target.shape != target.shape:
            target = raw.target
        verdict, reason = raw.verdict, raw.reason
        metrics, failed = raw.metrics, raw.failed
        node_type = golden.node_type or target.node_type or raw.node_type
        if verdict in (Verdict.PASS, Verdict.FAIL) and not pair.logits:
            figure = self._local_figure(pair.gkey, golden, target, node_type, metrics)
            if figure is not None:
                metrics = {**metrics, LOCAL: figure.ratio, INPUT_ERR: figure.input_error}
                if figure.failed and verdict is Verdict.PASS:
                    verdict, failed = Verdict.FAIL, (LOCAL,)
                    reason = figure.reason(op_kind(node_type))
        if self._diverge_at is not None and pair.gkey.token >= self._diverge_at:
            own = raw.verdict.value + (f": {raw.reason}" if raw.reason else "")
            verdict, reason = Verdict.DIVERGED, f"{self._diverge_reason} (by itself: {own})"
        return PairResult(  # positional: ~1 µs less than six keywords, a pair
            pair.gkey,
            verdict,
            metrics,
            failed,
            reason,
            golden,
            target,
            self._order_of("golden", golden),  # order
            node_type,
            self._layout.block_of(pair.gkey.node, part_of(pair.gkey.stem)),  # block
            pair.logits,  # is_logits
            raw.golden_stats,
            raw.target_stats,
        )

    def _inputs(self, key: TensorKey) -> list[PairResult | None]:
        """The node's input pairs at that token (``None``: paired, not compared yet)."""
        out: list[PairResult | None] = []
        for gkey in self._node_keys.get((key.token, key.rank, key.node), ()):
            if not gkey.stem.startswith("input"):
                continue
            pair = self._pairs.get(gkey)
            if pair is not None:
                out.append(pair.eff)
        return out

    def _local_figure(
        self,
        gkey: TensorKey,
        golden: TensorRecord,
        target: TensorRecord,
        node_type: str,
        metrics: dict[str, float],
    ) -> LocalFigure | None:
        """The local verdict's figure of an output pair; None while an input is not compared
        yet (the output is judged again when it is: :meth:`_set_eff`) or when the node has no
        captured float input (an embedding's integer ids count as error-free)."""
        if part_of(gkey.stem) != "output":
            return None
        klass = looser(golden.dtype, target.dtype)
        limit = self.thresholds.local_limit(klass, node_type)
        if limit is None:
            return None
        inputs = self._inputs(gkey)
        if any(r is None for r in inputs):
            return None
        floats = [
            r.metrics
            for r in inputs
            if r is not None
            and r.verdict in (Verdict.PASS, Verdict.FAIL)
            and dtype_class(r.golden.dtype if r.golden else "") != "int"
        ]
        if not floats:
            if not inputs or op_kind(node_type) != "embedding":
                return None
            floats = [embedding_input()]
        return local_figure(metrics, floats, klass, limit)

    def _set_eff(self, pair: _Pair) -> None:
        old = pair.eff
        new = self._effective(pair)
        if (
            old is not None
            and old.verdict is new.verdict
            and old.reason == new.reason
            and old.order == new.order
            and old.block == new.block
            and old.metrics == new.metrics
            and old.failed == new.failed
        ):
            return
        if old is not None:  # (a first result has nothing to take back)
            self._drop_eff(pair)
        pair.eff = new
        self._counts[new.verdict] += 1
        if is_failure(new):
            self._fails[pair.gkey.token].add(pair.gkey)
            self._logits_fails[pair.gkey.token] += new.is_logits
        member: Member = ("g", pair.gkey)
        self._changed.add(member)
        self._dirty_member(member)
        self._findings_dirty = True
        if part_of(pair.gkey.stem) == "input":  # the node's outputs are judged against it
            key = pair.gkey
            for gkey in self._node_keys.get((key.token, key.rank, key.node), ()):
                out = self._pairs.get(gkey)
                if out is not None and out.raw is not None and part_of(gkey.stem) == "output":
                    self._set_eff(out)

    def _drop_eff(self, pair: _Pair) -> None:
        if pair.eff is not None:
            self._counts[pair.eff.verdict] -= 1
            token = pair.gkey.token
            if pair.gkey in self._fails.get(token, ()):
                self._fails[token].discard(pair.gkey)
                if not self._fails[token]:
                    del self._fails[token]
                self._logits_fails[token] -= pair.eff.is_logits
            pair.eff = None
            self._findings_dirty = True

    def _reeffect_all(self) -> None:
        for pair in self._pairs.values():
            if pair.raw is not None:
                self._set_eff(pair)

    # --- cells -----------------------------------------------------------------------------
    def _cell_for(self, member: Member) -> tuple[int, int] | None:
        if not self._layout.blocks:
            return None  # no columns yet (a fresh session's records): what block_of says
        tag, key = member
        node = key.node
        if tag == "t":
            mapped = self._tmap.get(key)
            node = mapped.node if mapped is not None else key.node
        block = self._layout.block_of(node, part_of(key.stem))
        return (key.token, block) if block >= 0 else None

    def _place(self, member: Member) -> None:
        self._unplace(member)
        cell = self._cell_for(member)
        if cell is not None:
            self._members[cell].add(member)
            self._member_cell[member] = cell
            self._dirty_cells.add(cell)

    def _unplace(self, member: Member) -> None:
        cell = self._member_cell.pop(member, None)
        if cell is not None:
            self._members[cell].discard(member)
            self._dirty_cells.add(cell)

    def _dirty_member(self, member: Member) -> None:
        cell = self._member_cell.get(member)
        if cell is not None:
            self._dirty_cells.add(cell)

    # --- structure: pairing, layout, logits, divergence -------------------------------------
    def _refresh(self) -> None:
        sizes = (len(self._gnodes), len(self._tnodes))
        if self._struct_dirty or (self.pairer.auto is None and sizes != self._pairing_sizes):
            self._struct_dirty = False
            self._pairing_sizes = sizes
            if self.pairer.rebuild(
                self._topo["golden"],
                self._topo["target"],
                set(self._gnodes),
                set(self._tnodes),
                (self._weights["golden"], self._weights["target"]),
            ):
                for note in self.pairer.notes:
                    self._note(note)
                self._remap_all()
        if self._leftover_dirty and all(self._finished.values()):
            self._leftover_dirty = False
            self._apply_leftovers()
        self._refresh_layout()
        self._refresh_logits()
        if self._divergence_dirty:
            self._divergence_dirty = False
            self._refresh_divergence()

    def _remap_all(self) -> None:
        self._extra = {}
        self._tmap = {}
        self._by_g = defaultdict(set)
        for tkey in self._records["target"]:
            gkey = self.pairer.golden_key(tkey)
            self._tmap[tkey] = gkey
            if gkey is not None:
                self._by_g[gkey].add(tkey)
        for tkey in list(self._tonly):
            self._place(("t", tkey))
        for gkey in list(self._pairs) + list(self._records["golden"]):
            self._sync(gkey)
        self._leftover_dirty = True

    def _retarget(self, tkey: TensorKey, gkey: TensorKey | None) -> None:
        old = self._tmap.get(tkey)
        if old == gkey:
            return
        if old is not None:
            self._by_g[old].discard(tkey)
        self._tmap[tkey] = gkey
        if gkey is not None:
            self._by_g[gkey].add(tkey)
        if tkey in self._tonly:
            self._place(("t", tkey))
        if old is not None:
            self._sync(old)
        if gkey is not None:
            self._sync(gkey)

    def _apply_leftovers(self) -> None:
        """Both runs finished: pair what names left over when the node pairs but the stems differ
        (``output`` vs ``output_0``, ``input_hidden_states`` vs ``input_0``): see :func:`_leftover_pairs`."""
        for tkey in list(self._extra):
            self._retarget(tkey, self.pairer.golden_key(tkey))
        self._extra = {}
        golden = self._records["golden"]
        target = self._records["target"]
        groups_g: dict[tuple[object, ...], list[TensorKey]] = defaultdict(list)
        groups_t: dict[tuple[object, ...], list[TensorKey]] = defaultdict(list)
        for gkey in self._gonly:
            groups_g[(gkey.token, gkey.rank, gkey.node, part_of(gkey.stem))].append(gkey)
        for tkey in self._tonly:
            mapped = self._tmap.get(tkey)
            if mapped is not None:
                groups_t[(tkey.token, tkey.rank, mapped.node, part_of(tkey.stem))].append(tkey)
        found: dict[TensorKey, TensorKey] = {}
        for group, gkeys in groups_g.items():
            tkeys = groups_t.get(group)
            if tkeys:
                found.update(_leftover_pairs(gkeys, tkeys, golden, target))
        self._extra = found
        for tkey, gkey in found.items():
            self._retarget(tkey, gkey)

    def _refresh_layout(self) -> None:
        topo = self._topo["golden"]
        if topo is not None:
            if topo is self._layout_topo:
                return
            new = layout_for(topo)
        else:
            if not self._names_dirty:
                return
            topo = topology_from_names({n: (t, o) for n, (t, o, _) in self._gnodes.items()})
            new = layout_for(topo)
        self._names_dirty = False
        self._layout_topo = topo
        if new.blocks != self._layout.blocks:
            self._blocks_changed = True
            self._emitted.clear()
            self._table_shown = False
        self._layout = new
        if self.settled.blocks:
            moved = {k: new.block_of(*k) for k in self.settled.blocks}
            if moved != self.settled.blocks:
                self._dirty_cells.update(self.settled.cells)
                self.settled.relayout(moved)
        if not self._table_shown:
            self._dirty_cells.update(self.settled.cells)
        for member in (
            list(self._member_cell)
            + [("g", k) for k in self._records["golden"]]
            + [("t", k) for k in self._tonly]
        ):
            self._place(member)
        self._reeffect_all()
        self._dirty_cells.update(self._members)

    def _refresh_logits(self) -> None:
        topo = self._layout_topo
        node = None
        if topo is not None:
            leaves = [
                n
                for n in topo.nodes.values()
                if not n.children and n.order >= 0 and n.name in self._float_out
            ]
            if leaves:
                node = max(leaves, key=lambda n: n.order).name
        logits = (node, self._float_out.get(node) if node is not None else None)
        if logits == self._logits:
            return
        self._logits = logits
        for pair in self._pairs.values():
            want = self._want_logits(pair.gkey)
            if want != pair.logits:
                self._n_logits += want - pair.logits
                pair.logits = want
                self._requeue(pair)

    def _want_logits(self, gkey: TensorKey) -> bool:
        """The logits node's output, and the root's ``output_logits`` (or ``output`` when it has the
        logits' vocabulary size): compared with the logits metrics (KL, top-1, top-k, margin)."""
        if not gkey.stem.startswith("output"):
            return False
        record = self._records["golden"].get(gkey)
        if record is None or not _is_float(record.dtype):
            return False
        node, vocab = self._logits
        root = self._layout_topo.root if self._layout_topo is not None else "root"
        if gkey.node == node and node != root:
            return logits_shaped(tuple(record.shape), one_row=True)
        if gkey.node != root or not logits_shaped(tuple(record.shape)):
            return False  # a 1-D root output, or a last axis beyond any vocabulary: plain
        if gkey.stem == "output_logits":
            return True
        return (
            gkey.stem in ("output", "output_0")
            and vocab is not None
            and bool(record.shape)
            and record.shape[-1] == vocab
        )

    def _refresh_divergence(self) -> None:
        golden, target = self._token_ids["golden"], self._token_ids["target"]
        diverge = min(
            (t for t in golden.keys() & target.keys() if golden[t] != target[t]), default=None
        )
        if diverge == self._diverge_at:
            return
        self._diverge_at = diverge
        if diverge is not None:
            g, t = golden[diverge], target[diverge]
            self._diverge_reason = (
                f"diverged: the target was fed different input ids at token {diverge} "
                f"(golden {_ids(g)}, target {_ids(t)}); not blamed"
            )
            self._note(
                self._diverge_reason.replace("; not blamed", ": later tensors are marked diverged")
            )
        self._reeffect_all()


def _compatible(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Equal shapes, or equal but for the positions axis where one side kept only the last."""
    if a == b:
        return True
    return len(a) == len(b) >= 2 and a[:-2] == b[:-2] and a[-1] == b[-1] and 1 in (a[-2], b[-2])


def _leftover_pairs(
    gkeys: list[TensorKey],
    tkeys: list[TensorKey],
    golden: dict[TensorKey, TensorRecord],
    target: dict[TensorKey, TensorRecord],
) -> dict[TensorKey, TensorKey]:
    """Unpaired inputs (or outputs) of one node at one token, golden vs target: zipped in stem
    order when the counts agree and every zipped pair has compatible shapes; otherwise each
    target tensor whose shape fits exactly one golden tensor (and that one fits only it) pairs."""
    gkeys = sorted(gkeys, key=lambda k: stem_sort(k.stem))
    tkeys = sorted(tkeys, key=lambda k: stem_sort(k.stem))
    if len(gkeys) == len(tkeys) and all(
        _compatible(golden[g].shape, target[t].shape) for g, t in zip(gkeys, tkeys, strict=True)
    ):
        return dict(zip(tkeys, gkeys, strict=True))
    fits_t = {t: [g for g in gkeys if _compatible(golden[g].shape, target[t].shape)] for t in tkeys}
    fits_g = {g: [t for t in tkeys if _compatible(golden[g].shape, target[t].shape)] for g in gkeys}
    return {t: gs[0] for t, gs in fits_t.items() if len(gs) == 1 and len(fits_g[gs[0]]) == 1}


def _ids(ids: tuple[int, ...]) -> str:
    if len(ids) <= 4:
        return "[" + ", ".join(map(str, ids)) + "]"
    return "[…, " + ", ".join(map(str, ids[-3:])) + f"] ({len(ids)} ids)"
