"""Settled tokens of a live session: their pairs in a :class:`~.store.ResultStore`, their cells
as aggregates, their findings as row numbers.

A live session (``open``, ``watch``, ``run``) once kept every record of both runs and a
PairResult per pair until the end (~5 KB a pair). Once both runs are past a token and its
pairs are judged, nothing later changes them (see ``SessionState._settle`` in
:mod:`.state`), so the session hands them here and forgets their records: what stays is one
store row a pair (where both tensors' bytes are, so the detail pane can compare again), the
statistics msit's CSV columns print, the token's first-failure and root-cause candidates, and
one :class:`~.seam.CellUpdate` per (token, block). PairResults are built again only for what is
shown or exported.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
from layerwatch.engine.records import PairResult, Stats, TensorKey
from layerwatch.engine.seam import CellUpdate
from layerwatch.engine.session.cells import aggregate, merge_cells
from layerwatch.engine.session.store import CHUNK, ROW, ResultStore

EXTRA = np.dtype(
    [
        ("g_source", "<i4"),
        ("t_source", "<i4"),
        ("g_max", "<f4"),
        ("g_min", "<f4"),
        ("t_max", "<f4"),
        ("t_min", "<f4"),
        ("g_mean", "<f8"),
        ("t_mean", "<f8"),
    ]
)
"""What msit's CSV columns need beyond the store: each side's source (string id, -1: none) and
max/min/mean (NaN: none). A tensor's max and min are its own elements, exact in float32 for
every dtype up to fp32; a row whose are not (fp64 tensors) keeps them exactly on the side."""
_STATS = ("g_max", "g_min", "g_mean", "t_max", "t_min", "t_mean")


@dataclass(slots=True)
class TokenFindings:
    """A settled token's candidates, as store rows (-1: none)."""

    first: int
    cause: int
    captured: bool


class SettledTokens:
    """Everything a live session keeps of the tokens it has settled."""

    def __init__(self) -> None:
        self.store = ResultStore()
        self._extra: list[np.ndarray] = []
        self.ranges: dict[int, tuple[int, int]] = {}
        """Token → its store rows ``[start, stop)`` (a token is settled once, whole)."""
        self.cells: dict[tuple[int, int], CellUpdate] = {}
        """(token, block) → the aggregate of its settled pairs (``first_bad`` unset)."""
        self.findings: dict[int, TokenFindings] = {}
        """Tokens with a failure → their first-failure and root-cause rows."""
        self.tensors = {"golden": 0, "target": 0}
        self._wide: dict[int, tuple[float, ...]] = {}
        """Rows whose max/min float32 cannot hold exactly → their six statistics."""
        self.blocks: dict[tuple[str, str], int] = {}
        """(node, part) → block of the settled pairs (checked when the grid's columns change)."""

    def __len__(self) -> int:
        return len(self.store)

    @property
    def nbytes(self) -> int:
        return self.store.nbytes + sum(c.nbytes for c in self._extra)

    def add_token(
        self,
        token: int,
        results: list[PairResult],
        first: PairResult | None,
        cause: tuple[PairResult, bool] | None,
    ) -> None:
        """Keep ``token``'s judged pairs (its findings candidates among them)."""
        start = len(self.store)
        self.store.append(results)
        self._append_extra(results)
        self.ranges[token] = (start, len(self.store))
        at = {id(r): start + i for i, r in enumerate(results)}
        if first is not None:
            self.findings[token] = TokenFindings(
                at[id(first)], at[id(cause[0])] if cause else -1, cause[1] if cause else False
            )
        groups: dict[int, list[PairResult]] = defaultdict(list)
        for result in results:
            self.blocks[(result.key.node, result.key.part)] = result.block
            if result.block >= 0:
                groups[result.block].append(result)
        for block, members in groups.items():
            self.cells[(token, block)] = merge_cells(
                self.cells.get((token, block)), aggregate(token, block, members)
            )
        self.tensors["golden"] += len(results)
        self.tensors["target"] += len(results)

    def _append_extra(self, results: list[PairResult]) -> None:
        s = self.store.strings.id
        n = len(self.store) - len(results)
        rows = []
        for i, r in enumerate(results):
            g = _stats(r.golden.stats if r.golden is not None else None, r.golden_stats)
            t = _stats(r.target.stats if r.target is not None else None, r.target_stats)
            if not all(_narrow(v) for v in (g[0], g[1], t[0], t[1])):
                self._wide[n + i] = (*g, *t)
            rows.append(
                (
                    s(r.golden.source) if r.golden is not None and r.golden.source else -1,
                    s(r.target.source) if r.target is not None and r.target.source else -1,
                    g[0],
                    g[1],
                    t[0],
                    t[1],
                    g[2],
                    t[2],
                )
            )
        batch = np.array(rows, dtype=EXTRA)
        done = 0
        while done < len(batch):
            if n == len(self._extra) * CHUNK:
                self._extra.append(np.zeros(CHUNK, EXTRA))
            at = n % CHUNK
            take = min(CHUNK - at, len(batch) - done)
            self._extra[-1][at : at + take] = batch[done : done + take]
            done += take
            n += take

    # --- reading ----------------------------------------------------------------------------
    def result(self, i: int) -> PairResult:
        """Row ``i`` as the PairResult the session had (records without their statistics: the
        CSV's max/min/mean ride in ``golden_stats``/``target_stats``)."""
        result = self.store.result(i)
        extra = self._extra[i // CHUNK][i % CHUNK]
        values = self.store.strings.values
        for p, record in (("g", result.golden), ("t", result.target)):
            if record is not None and extra[f"{p}_source"] >= 0:
                record.source = values[extra[f"{p}_source"]]
        wide = self._wide.get(i)
        stats = wide or tuple(float(extra[name]) for name in _STATS)
        result.golden_stats = _unstats(stats[:3]) if result.golden is not None else None
        result.target_stats = _unstats(stats[3:]) if result.target is not None else None
        return result

    def cells_of(self, token: int) -> list[tuple[tuple[int, int], CellUpdate]]:
        _, cols = self._token_rows(token)
        blocks = np.unique(cols["block"]) if len(cols) else ()
        return [((token, int(b)), self.cells[(token, int(b))]) for b in blocks if b >= 0]

    def results(self, rows: Iterable[int] | None = None) -> Iterator[PairResult]:
        for i in range(len(self.store)) if rows is None else rows:
            yield self.result(i)

    def rows_of(self, token: int) -> range:
        start, stop = self.ranges.get(token, (0, 0))
        return range(start, stop)

    def _token_rows(self, token: int) -> tuple[range, np.ndarray]:
        """The token's rows and their columns (one small copy: a token is a few thousand rows)."""
        rows = self.rows_of(token)
        if not rows:
            return rows, np.zeros(0, ROW)
        parts = []
        i = rows.start
        while i < rows.stop:
            chunk = self.store.chunk(i // CHUNK)
            take = min(rows.stop - i, CHUNK - i % CHUNK)
            parts.append(chunk[i % CHUNK : i % CHUNK + take])
            i += take
        return rows, np.concatenate(parts) if len(parts) > 1 else parts[0]

    def holds(self, key: TensorKey) -> bool:
        """``key`` (a golden key) is among the settled pairs."""
        rows, cols = self._token_rows(key.token)
        ids = self.store.strings._ids
        node, stem = ids.get(key.node), ids.get(key.stem)
        if not rows or node is None or stem is None:
            return False
        return bool(
            np.any((cols["node"] == node) & (cols["stem"] == stem) & (cols["rank"] == key.rank))
        )

    def in_block(self, token: int, block: int) -> list[PairResult]:
        rows, cols = self._token_rows(token)
        if not rows:
            return []
        hits = np.flatnonzero(cols["block"] == block)
        return [self.result(rows.start + int(i)) for i in hits]

    def inputs(self, key: TensorKey) -> list[PairResult]:
        """The settled input pairs of ``key``'s node at its token."""
        rows, cols = self._token_rows(key.token)
        if not rows:
            return []
        strings = self.store.strings
        node = strings._ids.get(key.node)
        if node is None:
            return []
        hits = np.flatnonzero((cols["node"] == node) & (cols["rank"] == key.rank))
        out = []
        for i in hits:
            if strings.values[cols["stem"][i]].startswith("input"):
                out.append(self.result(rows.start + int(i)))
        return out

    def records_at(self, key: TensorKey, side: str) -> list[PairResult]:
        """Every settled pair of ``key``'s node at its token (the precheck line's call)."""
        rows, cols = self._token_rows(key.token)
        node = self.store.strings._ids.get(key.node)
        if not rows or node is None:
            return []
        hits = np.flatnonzero((cols["node"] == node) & (cols["rank"] == key.rank))
        return [self.result(rows.start + int(i)) for i in hits]

    def logits_at(self, token: int) -> list[PairResult]:
        rows, cols = self._token_rows(token)
        if not rows:
            return []
        return [self.result(rows.start + int(i)) for i in np.flatnonzero(cols["logits"])]

    def relayout(self, block_of: dict[tuple[str, str], int]) -> None:
        """The grid's columns changed after tokens settled: every row's block again (from its
        node and part) and the settled cells rebuilt. Rare (a topology that lands late)."""
        values = self.store.strings.values
        self.blocks = dict(block_of)
        self.cells.clear()
        for token, (start, stop) in self.ranges.items():
            results = []
            for i in range(start, stop):
                chunk, at = self.store.chunk(i // CHUNK), i % CHUNK
                node, stem = values[chunk["node"][at]], values[chunk["stem"][at]]
                part = "input" if stem.startswith("input") else "output"
                chunk["block"][at] = block_of.get((node, part), -1)
                results.append(self.result(i))
            groups: dict[int, list[PairResult]] = defaultdict(list)
            for r in results:
                if r.block >= 0:
                    groups[r.block].append(r)
            for block, members in groups.items():
                self.cells[(token, block)] = aggregate(token, block, members)


def _stats(stats: Stats | None, computed: Stats | None) -> tuple[float, float, float]:
    s = stats or computed
    if s is None:
        return (math.nan, math.nan, math.nan)
    return (s.max, s.min, s.mean)


def _narrow(value: float) -> bool:
    """float32 holds ``value`` exactly (NaN and infinities included)."""
    return value != value or float(np.float32(value)) == value


def _unstats(values: tuple[float, ...]) -> Stats | None:
    if all(v != v for v in values):
        return None
    return Stats(values[0], values[1], values[2], math.nan)
