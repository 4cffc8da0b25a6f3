"""Per-pair results of a whole run in compact columns: what a pair must keep once compared.

A :class:`~layerwatch.engine.records.PairResult` with its two records and its metrics dict costs
~4-5 KB of Python objects; a long run of a big model has millions of pairs. The store keeps,
per pair, the key, the verdict, the order and block, the reason and failed metrics (as ids into
string tables), the metric values (float64, exact), and for each side where its bytes are
(path id, offset, size, dtype, shape), so a pair can be compared again to show its detail.
About 100 bytes a pair plus the metric values that are not exactly 0 or 1 (those ride in the
pair's metric-set id). Rows are fixed-size chunks of a numpy structured array, so growing
never copies what is stored.

:meth:`ResultStore.row` gives the ``--json`` row of a pair (the same dict as
``report.json_report`` writes), :meth:`ResultStore.result` a PairResult without statistics.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
from layerwatch.engine.records import Locator, PairResult, TensorKey, TensorRecord, Verdict

CHUNK = 1 << 16
"""Rows per chunk (a chunk is allocated whole: ~6 MB)."""
POOL_CHUNK = 1 << 20
"""Metric values per chunk of the value pool (8 MB)."""

_VERDICTS = tuple(Verdict)
_VERDICT_ID = {v: i for i, v in enumerate(_VERDICTS)}
_SIDE = [("path", "<i4"), ("offset", "<i8"), ("nbytes", "<i8"), ("shape", "<i4"), ("dtype", "<i2")]

ROW = np.dtype(
    [
        ("token", "<i4"),
        ("rank", "<i2"),
        ("verdict", "i1"),
        ("logits", "i1"),
        ("node", "<i4"),
        ("stem", "<i4"),
        ("order", "<i8"),  # ATB orders are post-order keys up to 10^18 (readers/atb.py)
        ("block", "<i4"),
        ("node_type", "<i4"),
        ("reason", "<i4"),
        ("failed", "<i4"),
        ("mset", "<i4"),
        ("mpos", "<i8"),
        *((f"g_{name}", kind) for name, kind in _SIDE),
        *((f"t_{name}", kind) for name, kind in _SIDE),
    ]
)
"""One pair. ``mset``: id of the metric names (and which of them are exactly 0.0 or 1.0);
``mpos``: where the pair's other metric values start in the pool. Side path -1: no payload (a
statistics-only record, or a locator the store cannot describe: strided views, NZ layout)."""


class Strings:
    """Interned values ↔ small ids (node names, stems, paths, reasons, shapes...)."""

    def __init__(self) -> None:
        self._ids: dict[Any, int] = {}
        self.values: list[Any] = []

    def id(self, value: Any) -> int:
        found = self._ids.get(value)
        if found is None:
            found = self._ids[value] = len(self.values)
            self.values.append(value)
        return found

    def __len__(self) -> int:
        return len(self.values)


_CONST = (0.0, 1.0)
NO_TENSOR = -2
"""Side path id of a pair with no tensor on that side (unpaired)."""
NO_PAYLOAD = -1
"""Side path id of a tensor whose bytes the store cannot point at (statistics only, views)."""
TOKEN_MARK = "\x00"
"""Stands for the pair's token in a stored path: msit and ATB write a file per tensor under a
directory per token (``…/cpu_1/{token}/{node}/output.pth``), so a path kept whole would be a new
string every pair (~300 B); with its token directory marked it is one string a node."""


class ResultStore:
    """Append-only columns of pair results (one home for "what a compared pair keeps")."""

    def __init__(self) -> None:
        self._chunks: list[np.ndarray] = []
        self._n = 0
        self._pool: list[np.ndarray] = []
        self._pool_n = 0
        self.strings = Strings()
        """Node names, stems, node types, reasons, paths, dtypes."""
        self.shapes = Strings()
        self.failed_sets = Strings()
        self.metric_sets = Strings()
        """Tuples of ``(name, 0.0 | 1.0 | None)``: None means the value is in the pool."""
        self.counts: Counter[Verdict] = Counter()
        self.strings.id("")  # id 0: no reason, no type

    def __len__(self) -> int:
        return self._n

    @property
    def nbytes(self) -> int:
        """Bytes of the columns and the value pool (not the tables of distinct strings)."""
        return sum(c.nbytes for c in self._chunks) + sum(p.nbytes for p in self._pool)

    # --- writing ----------------------------------------------------------------------------
    def append(self, results: Iterable[PairResult]) -> None:
        """Store ``results`` (a window's worth at a time: rows are built as tuples and copied
        into the chunks in slices, ~2 µs a pair)."""
        rows = [self._tuple(r) for r in results]
        if not rows:
            return
        batch = np.array(rows, dtype=ROW)
        done = 0
        while done < len(batch):
            if self._n == len(self._chunks) * CHUNK:
                self._chunks.append(np.zeros(CHUNK, ROW))
            at = self._n % CHUNK
            take = min(CHUNK - at, len(batch) - done)
            self._chunks[-1][at : at + take] = batch[done : done + take]
            done += take
            self._n += take

    def _tuple(self, result: PairResult) -> tuple[Any, ...]:
        key = result.key
        s = self.strings.id
        names: list[tuple[str, float | None]] = []
        pos = self._pool_n
        for name, value in result.metrics.items():
            if value in _CONST and math.copysign(1.0, value) > 0:
                names.append((name, float(value)))
            else:
                names.append((name, None))
                self._put(value)
        self.counts[result.verdict] += 1
        return (
            key.token,
            key.rank,
            _VERDICT_ID[result.verdict],
            result.is_logits,
            s(key.node),
            s(key.stem),
            result.order,
            result.block,
            s(result.node_type),
            s(result.reason),
            self.failed_sets.id(tuple(result.failed)),
            self.metric_sets.id(tuple(names)),
            pos,
            *self._side(result.golden, key.token),
            *self._side(result.target, key.token),
        )

    def _path_id(self, path: str, token: int) -> int:
        part = f"{os.sep}{token}{os.sep}"
        at = path.rfind(part)
        if at >= 0:
            path = f"{path[:at]}{os.sep}{TOKEN_MARK}{os.sep}{path[at + len(part) :]}"
        return self.strings.id(path)

    def _side(self, record: TensorRecord | None, token: int) -> tuple[int, int, int, int, int]:
        if record is None:
            return (NO_TENSOR, 0, 0, 0, 0)
        loc = record.loc
        if (
            loc is None
            or loc.strides is not None
            or loc.elem_offset
            or loc.layout
            or loc.stored_shape
        ):
            shape, dtype = tuple(record.shape), record.dtype
            return (NO_PAYLOAD, 0, 0, self.shapes.id(shape), self.strings.id(dtype))
        return (
            self._path_id(loc.path, token),
            loc.offset,
            loc.nbytes,
            self.shapes.id(tuple(loc.shape)),
            self.strings.id(loc.dtype),
        )

    def _put(self, value: float) -> None:
        if self._pool_n == len(self._pool) * POOL_CHUNK:
            self._pool.append(np.zeros(POOL_CHUNK, "<f8"))
        self._pool[-1][self._pool_n % POOL_CHUNK] = value
        self._pool_n += 1

    # --- reading ----------------------------------------------------------------------------
    def _row(self, i: int) -> np.void:
        if not 0 <= i < self._n:
            raise IndexError(i)
        return self._chunks[i // CHUNK][i % CHUNK]

    def column(self, name: str) -> np.ndarray:
        """One column over every stored pair (a copy)."""
        if not self._chunks:
            return np.zeros(0, ROW[name])
        return np.concatenate([c[name] for c in self._chunks])[: self._n]

    def metrics(self, i: int) -> dict[str, float]:
        row = self._row(i)
        pos = int(row["mpos"])
        out: dict[str, float] = {}
        for name, const in self.metric_sets.values[int(row["mset"])]:
            if const is None:
                out[name] = float(self._pool[pos // POOL_CHUNK][pos % POOL_CHUNK])
                pos += 1
            else:
                out[name] = const
        return out

    def key(self, i: int) -> TensorKey:
        row = self._row(i)
        v = self.strings.values
        return TensorKey(int(row["token"]), v[row["node"]], v[row["stem"]], int(row["rank"]))

    def verdict(self, i: int) -> Verdict:
        return _VERDICTS[int(self._row(i)["verdict"])]

    def row(self, i: int) -> dict[str, Any]:
        """The pair's ``--json`` row (``PairResult.to_json``'s shape, non-finite metrics kept)."""
        row = self._row(i)
        key = self.key(i)
        return {
            "token": key.token,
            "node": key.node,
            "tensor": key.stem,
            "rank": key.rank,
            "verdict": _VERDICTS[int(row["verdict"])].value,
            "metrics": self.metrics(i),
            "reason": self.strings.values[row["reason"]],
        }

    def record(self, i: int, side: str) -> TensorRecord | None:
        """What is needed to load the pair's ``side`` again (``golden``/``target``); None when
        the pair has no tensor on that side."""
        row = self._row(i)
        p = side[0]
        path = int(row[f"{p}_path"])
        if path == NO_TENSOR:
            return None
        key = self.key(i)
        dtype = self.strings.values[row[f"{p}_dtype"]]
        shape = self.shapes.values[row[f"{p}_shape"]]
        loc = None
        if path >= 0:
            loc = Locator(
                self.strings.values[path].replace(TOKEN_MARK, str(key.token)),
                int(row[f"{p}_offset"]),
                int(row[f"{p}_nbytes"]),
                dtype,
                shape,
            )
        return TensorRecord(key, dtype, shape, loc, node_type=self.strings.values[row["node_type"]])

    def result(self, i: int) -> PairResult:
        """The pair as a PairResult (records without statistics: compare again for those)."""
        row = self._row(i)
        verdict = _VERDICTS[int(row["verdict"])]
        return PairResult(
            self.key(i),
            verdict,
            self.metrics(i),
            self.failed_sets.values[row["failed"]],
            self.strings.values[row["reason"]],
            self.record(i, "golden"),
            self.record(i, "target"),
            order=int(row["order"]),
            node_type=self.strings.values[row["node_type"]],
            block=int(row["block"]),
            is_logits=bool(row["logits"]),
        )

    def rows(self, indices: Sequence[int] | None = None) -> Iterator[dict[str, Any]]:
        for i in range(self._n) if indices is None else indices:
            yield self.row(i)
