"""Settled tokens of a live session: their pairs in a :class:`~.store.ResultStore`, their cells
as aggregates, their findings as row numbers.

A live session (``open``, ``watch``, ``run``) once kept every record of both runs and a
PairResult per pair until the end (~5 KB a pair). Once both runs are past a token and its
pairs are judged, nothing later changes them (see ``SessionState._settle`` in
:mod:`.state`), so the session hands them here and forgets their records: what stays is one
store row a pair (where both tensors' bytes are, so the detail pane can compare again, and
the statistics msit's CSV columns print, in the row's :data:`EXTRA` fields), the token's
first-failure and root-cause candidates, and its cells as rows of a
:class:`~.cell_table.CellTable`. PairResults and CellUpdates are built again only for what is
shown or exported. Given a ``spill`` directory the store writes its full chunks there, as a
headless compare's does (engine/session/store.py), so RAM keeps a few bytes a pair.
"""

from __future__ import annotations

import itertools
import math
import operator
import os
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from layerwatch.engine.records import PairResult, Stats, TensorKey, stem_part
from layerwatch.engine.seam import CellUpdate
from layerwatch.engine.session.cell_table import CellTable
from layerwatch.engine.session.cells import aggregate, is_failure
from layerwatch.engine.session.findings import failure_key
from layerwatch.engine.session.store import (
    CHUNK,
    NO_TENSOR,
    READ_ROWS,
    TOKEN_MARK,
    VERDICTS,
    ResultStore,
)

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
SideFields = tuple[str, str, str, tuple[int, ...], tuple[float, float, float] | None]
"""A report line's side: path, node type, dtype, shape, (max, min, mean) or None."""
LineFields = tuple[
    int, SideFields | None, SideFields | None, list[Any], str, tuple[str, ...], str, str, int
]
"""A report line's fields (:meth:`SettledTokens.line_fields`)."""


@dataclass(slots=True)
class TokenFindings:
    """A settled token's candidates, as store rows (-1: none)."""

    first: int
    cause: int
    captured: bool


class SettledTokens:
    """Everything a live session keeps of the tokens it has settled."""

    def __init__(self, spill: str | os.PathLike[str] | None = None) -> None:
        self.store = ResultStore(spill, extra=EXTRA)
        self.ranges: dict[int, tuple[int, int]] = {}
        """Token → its store rows ``[start, stop)`` (a token is settled once, whole)."""
        self.cells = CellTable()
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
        """Bytes of columns held in RAM (store rows and values not spilled, the cells)."""
        return self.store.nbytes + self.cells.nbytes

    def close(self) -> None:
        """Give the spill files' space back (reading spilled pairs fails after this)."""
        self.store.close()

    def add_token(
        self,
        token: int,
        results: list[PairResult],
        first: PairResult | None,
        cause: tuple[PairResult, bool] | None,
    ) -> None:
        """Keep ``token``'s judged pairs, in report order (its findings candidates among them)."""
        start = len(self.store)
        self.store.append(results, self._extra(results, start))
        self.ranges[token] = (start, len(self.store))
        if first is not None:
            self.findings[token] = TokenFindings(
                start + _index_of(results, first),
                start + _index_of(results, cause[0]) if cause else -1,
                cause[1] if cause else False,
            )
        self.blocks.update(
            ((key.node, stem_part(key.stem)), block) for key, block in map(_KEY_BLOCK, results)
        )
        self.cells.add_token(token, _cells(token, results, start))
        self.tensors["golden"] += len(results)
        self.tensors["target"] += len(results)

    def _extra(self, results: list[PairResult], n: int) -> list[tuple[object, ...]]:
        """Each result's :data:`EXTRA` row; rows whose max/min float32 cannot hold exactly go
        to ``_wide`` too (found with numpy over the token, not a float32 scalar a value)."""
        s = self.store.strings.id
        rows: list[tuple[object, ...]] = []
        for r in results:
            golden, target = r.golden, r.target
            g = (golden.stats if golden is not None else None) or r.golden_stats
            t = (target.stats if target is not None else None) or r.target_stats
            rows.append(
                (
                    s(golden.source) if golden is not None and golden.source else -1,
                    s(target.source) if target is not None and target.source else -1,
                    *((g.max, g.min) if g is not None else _NO_RANGE),
                    *((t.max, t.min) if t is not None else _NO_RANGE),
                    g.mean if g is not None else math.nan,
                    t.mean if t is not None else math.nan,
                )
            )
        for i in _wide_rows(rows):
            row = cast(tuple[float, ...], rows[i])  # its statistics are floats
            self._wide[n + i] = (row[2], row[3], row[6], row[4], row[5], row[7])
        return rows

    # --- reading ----------------------------------------------------------------------------
    def result(self, i: int) -> PairResult:
        """Row ``i`` as the PairResult the session had (records without their statistics: the
        CSV's max/min/mean ride in ``golden_stats``/``target_stats``)."""
        return self._results_between(i, i + 1)[0]

    def cells_of(self, token: int) -> Iterator[CellUpdate]:
        return self.cells.cells_of(token)

    def results(self, rows: Iterable[int] | None = None) -> Iterator[PairResult]:
        if rows is None:
            rows = range(len(self.store))
        if not isinstance(rows, range) or rows.step != 1:
            for i in rows:
                yield self.result(i)
            return
        for start in range(rows.start, rows.stop, READ_ROWS):
            yield from self._results_between(start, min(start + READ_ROWS, rows.stop))

    def _results_between(self, start: int, stop: int) -> list[PairResult]:
        """:meth:`result` of rows ``[start, stop)``, read together (a report reads every row)."""
        out, extra = self.store.results_between(start, stop)
        values = self.store.strings.values
        sources = [extra["g_source"].tolist(), extra["t_source"].tolist()]
        stats = list(zip(*(extra[name].tolist() for name in _STATS), strict=True))
        for j, result in enumerate(out):
            for k, record in enumerate((result.golden, result.target)):
                if record is not None and sources[k][j] >= 0:
                    record.source = values[sources[k][j]]
            gmax, gmin, gmean, tmax, tmin, tmean = self._wide.get(start + j) or stats[j]
            if result.golden is not None and not (gmax != gmax and gmin != gmin and gmean != gmean):
                result.golden_stats = Stats(gmax, gmin, gmean, math.nan)
            if result.target is not None and not (tmax != tmax and tmin != tmin and tmean != tmean):
                result.target_stats = Stats(tmax, tmin, tmean, math.nan)
        return out

    def line_fields(self, rows: range, names: Sequence[str]) -> Iterator[LineFields]:
        """What a report line of each of ``rows`` holds, read from the store's columns a block
        at a time: (token, golden side, target side, the values of ``names``, verdict, failed
        metrics, reason, node type, order); a side is (path, node type, dtype, shape, its
        (max, min, mean) or None), None when the pair has no tensor there. The fields
        :meth:`results` of those rows give (``report.field_lines`` writes ``csv_line``'s bytes
        from them, ``tests/engine/session/test_live_store.py``) without a PairResult, two
        records and their key and locators a pair (reading those back cost as much as the
        lines themselves)."""
        for start in range(rows.start, rows.stop, READ_ROWS):
            yield from self._fields_between(start, min(start + READ_ROWS, rows.stop), names)

    def _fields_between(self, start: int, stop: int, names: Sequence[str]) -> list[LineFields]:
        store = self.store
        rows = store.rows_between(start, stop)
        if not len(rows):
            return []
        col = store.columns(rows)
        v, shapes, fsets = store.strings.values, store.shapes.values, store.failed_sets.values
        verdicts = [verdict.value for verdict in VERDICTS]
        stats = list(zip(*(col[name] for name in _STATS), strict=True))
        wide = self._wide
        tokens, node_types = col["token"], col["node_type"]
        sides = [
            [col[f"{p}_{name}"] for name in ("source", "path", "dtype", "shape")] for p in "gt"
        ]
        out: list[LineFields] = []
        for j, values in enumerate(store.metric_lists(col, names)):
            token = tokens[j]
            node_type = v[node_types[j]]
            fields: list[SideFields | None] = []
            numbers = wide.get(start + j) or stats[j]
            for k, (sources, paths, dtypes, shapes_of) in enumerate(sides):
                path = paths[j]
                if path == NO_TENSOR:
                    fields.append(None)
                    continue
                hi, lo, mean = numbers[3 * k : 3 * k + 3]
                source = v[sources[j]] if sources[j] >= 0 else ""
                fields.append(
                    (
                        source or (v[path].replace(TOKEN_MARK, str(token)) if path >= 0 else ""),
                        node_type,
                        v[dtypes[j]],
                        shapes[shapes_of[j]],
                        None if hi != hi and lo != lo and mean != mean else (hi, lo, mean),
                    )
                )
            out.append(
                (
                    token,
                    fields[0],
                    fields[1],
                    values,
                    verdicts[col["verdict"][j]],
                    fsets[col["failed"][j]],
                    v[col["reason"][j]],
                    node_type,
                    col["order"][j],
                )
            )
        return out

    def ranks(self) -> set[int]:
        """The ranks among the settled pairs (read a chunk at a time)."""
        out: set[int] = set()
        for start in range(0, len(self.store), CHUNK):
            rows = self.store.rows_between(start, min(start + CHUNK, len(self.store)))
            out.update(np.unique(rows["rank"]).tolist())
        return out

    def rows_of(self, token: int) -> range:
        start, stop = self.ranges.get(token, (0, 0))
        return range(start, stop)

    def _token_rows(self, token: int) -> tuple[range, np.ndarray]:
        """The token's rows and their columns (one small copy: a token is a few thousand rows)."""
        rows = self.rows_of(token)
        return rows, self.store.rows_between(rows.start, rows.stop)

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
        cells = CellTable()
        for token, (start, stop) in self.ranges.items():
            cols = self.store.rows_between(start, stop)
            blocks = np.array(
                [
                    block_of.get(
                        (values[n], "input" if values[s].startswith("input") else "output"), -1
                    )
                    for n, s in zip(cols["node"], cols["stem"], strict=True)
                ],
                dtype=cols["block"].dtype,
            )
            self.store.set_column(start, "block", blocks)
            cells.add_token(token, _cells(token, list(self.results(range(start, stop))), start))
        self.cells = cells


def _cells(token: int, results: list[PairResult], start: int) -> list[tuple[CellUpdate, int]]:
    """The cells of a token's results (store rows from ``start``, report order), each with the
    row of its first failure (the order the first failure is chosen in: ``failure_key``)."""
    groups: dict[int, list[PairResult]] = defaultdict(list)
    first: dict[int, tuple[tuple[object, ...], int]] = {}
    for i, result in enumerate(results):
        if result.block >= 0:
            groups[result.block].append(result)
            if is_failure(result):
                where = failure_key(result)
                if result.block not in first or where < first[result.block][0]:
                    first[result.block] = (where, start + i)
    return [
        (aggregate(token, block, members), first[block][1] if block in first else -1)
        for block, members in groups.items()
    ]


_NO_RANGE = (math.nan, math.nan)
_KEY_BLOCK = operator.attrgetter("key", "block")
_RANGE = operator.itemgetter(2, 3, 4, 5)


def _index_of(results: list[PairResult], result: PairResult) -> int:
    """Where ``result`` itself (not an equal result) is in ``results``, in C."""
    return list(map(operator.is_, results, itertools.repeat(result))).index(True)


def _wide_rows(rows: list[tuple[object, ...]]) -> list[int]:
    """The :data:`EXTRA` rows whose max or min (fields 2-5) float32 does not hold exactly (NaN
    and infinities it does): each value against its float32 rounding, as ``v != v or
    float(np.float32(v)) == v`` decides it, a token at a time (a float32 scalar a value cost
    ~1 µs a pair). The comparisons are Python's (in C, by ``map``), so an int statistic beyond
    2**53 is judged exactly, as it was."""
    if not rows:
        return []
    flat = list(itertools.chain.from_iterable(map(_RANGE, rows)))
    with np.errstate(over="ignore"):  # beyond float32's range: inf, not equal, so wide
        back = np.array(flat, np.float64).astype(np.float32).astype(np.float64).tolist()
    narrow = np.fromiter(
        map(operator.or_, map(operator.ne, flat, flat), map(operator.eq, back, flat)),
        bool,
        len(flat),
    )
    return np.flatnonzero(~narrow.reshape(-1, 4).all(axis=1)).tolist()
