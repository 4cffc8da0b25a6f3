"""Per-pair results of a whole run in compact columns: what a pair must keep once compared.

A :class:`~layerwatch.engine.records.PairResult` with its two records and its metrics dict costs
~4-5 KB of Python objects; a long run of a big model has millions of pairs. The store keeps,
per pair, the key, the verdict, the order and block, the reason and failed metrics (as ids into
string tables), the metric values (float64, exact), and for each side where its bytes are
(path id, offset, size, dtype, shape), so a pair can be compared again to show its detail.
About 100 bytes a pair plus the metric values that are not exactly 0 or 1 (those ride in the
pair's metric-set id). Rows are fixed-size chunks of a numpy structured array, so growing
never copies what is stored.

A store given a ``spill`` directory writes each full chunk (rows and value pool) once to a
file there and drops it from RAM; spilled rows are read back on demand :data:`READ_ROWS` at a
time into a small cache (:data:`CACHED` reads), a pair's metric values with one read of just
those. RAM then holds the string tables, the counts, the chunks being filled and the cache,
whatever the number of pairs. Reading (``pread``) rather than ``np.memmap``:
a mapped file's pages count in the process's RSS until the kernel reclaims them, so a scan
over a memmapped 123 MB rows file added 123 MB of RSS, until ``MADV_DONTNEED`` or unmapping.
The files are unnamed (``O_TMPFILE``) unless kept, so they vanish with the process however it
ends; :meth:`ResultStore.close` gives their space back at once.

:meth:`ResultStore.row` gives the ``--json`` row of a pair (the same dict as
``report.json_report`` writes), :meth:`ResultStore.result` a PairResult without statistics.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import weakref
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.records import Locator, PairResult, TensorKey, TensorRecord, Verdict

CHUNK = 1 << 16
"""Rows per chunk (a chunk is allocated whole: ~6 MB)."""
POOL_CHUNK = 1 << 20
"""Metric values per chunk of the value pool (8 MB)."""
READ_ROWS = 4096
"""Spilled rows read a time (~420 KB); the reads of a scan stay small, so freed memory is
reused rather than left to grow the heap."""
CACHED = 4
"""Reads of spilled rows kept in RAM (the detail pane, a window of the grid)."""

VERDICTS = tuple(Verdict)
"""Verdicts by their stored id."""
_VERDICT_ID = {v: i for i, v in enumerate(VERDICTS)}
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
        self.seen = self._ids.get
        """The id of a value met before, else None (gives no id): the dict's own ``get``, a C
        call where :meth:`id` is a Python one (~10 ids a stored pair)."""

    def id(self, value: Any) -> int:
        found = self._ids.get(value)
        if found is None:
            found = self._ids[value] = len(self.values)
            self.values.append(value)
        return found

    def __len__(self) -> int:
        return len(self.values)


SIDE_IDS = 4096
"""Entries of a store's side-id cache before it starts over (per-tensor files never repeat)."""
_CONST = (0.0, 1.0)
NO_TENSOR = -2
"""Side path id of a pair with no tensor on that side (unpaired)."""
NO_PAYLOAD = -1
"""Side path id of a tensor whose bytes the store cannot point at (statistics only, views)."""
TOKEN_MARK = "\x00"
"""Stands for the pair's token in a stored path: msit and ATB write a file per tensor under a
directory per token (``…/cpu_1/{token}/{node}/output.pth``), so a path kept whole would be a new
string every pair (~300 B); with its token directory marked it is one string a node."""


class _Spilled:
    """Full chunks of one kind (rows or pool values), each written once at its place in one
    file (element ``n`` at ``n * itemsize``), read back a slice at a time."""

    def __init__(self, directory: Path, kind: str, dtype: np.dtype, count: int, keep: bool):
        self.directory = directory
        self.dtype = dtype
        self.chunk_bytes = dtype.itemsize * count
        self.path: Path | None = None
        try:
            if keep:
                fd, name = tempfile.mkstemp(prefix=f".layerwatch-{kind}-", dir=directory)
                self.path = Path(name)
                self.fh: IO[bytes] = os.fdopen(fd, "w+b", buffering=0)
            else:  # unnamed (O_TMPFILE): nothing is left behind, however the process ends
                self.fh = tempfile.TemporaryFile(dir=directory, buffering=0)  # noqa: SIM115
        except OSError as exc:
            raise _disk_error(directory, exc) from None
        self.fd = self.fh.fileno()
        self.chunks = 0
        """Chunks written: elements below ``chunks * count`` are on disk."""

    @property
    def nbytes(self) -> int:
        return self.chunks * self.chunk_bytes

    def write(self, index: int, chunk: np.ndarray) -> None:
        data = chunk.view(np.uint8).data
        at = index * self.chunk_bytes
        try:
            while data:
                done = os.pwrite(self.fd, data, at)
                data, at = data[done:], at + done
        except OSError as exc:  # cut the partial chunk back out: its space is needed now
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, index * self.chunk_bytes)
            raise _disk_error(self.directory, exc) from None
        self.chunks = max(self.chunks, index + 1)

    def write_at(self, first: int, values: np.ndarray) -> None:
        """Overwrite elements ``first`` on (already on disk) in place."""
        data = np.ascontiguousarray(values).view(np.uint8).data
        at = first * self.dtype.itemsize
        try:
            while data:
                done = os.pwrite(self.fd, data, at)
                data, at = data[done:], at + done
        except OSError as exc:
            raise _disk_error(self.directory, exc) from None

    def read(self, first: int, count: int) -> np.ndarray:
        """Elements ``first`` to ``first + count`` (all on disk), read-only."""
        out = np.empty(count, self.dtype)
        view = out.view(np.uint8).data
        at = first * self.dtype.itemsize
        while view:
            got = os.preadv(self.fd, [view], at)
            if got <= 0:
                raise LayerwatchError(f"spilled results in {self.directory} were cut short")
            view, at = view[got:], at + got
        out.flags.writeable = False
        return out

    def close(self) -> None:
        self.fh.close()


def _disk_error(directory: Path, exc: OSError) -> LayerwatchError:
    return LayerwatchError(f"spilling results to {directory}: {exc.strerror or exc}")


def _close_all(files: list[_Spilled]) -> None:
    for spilled in files:
        with contextlib.suppress(OSError):
            spilled.close()


def _unique_rows(kind: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(kind, axis=0, return_index=True, return_inverse=True)`` (the inverse flat)
    for rows of codes 0–2: each row packed into one int64, 2 bits a column, the first column
    the most significant, so the packed values sort as the rows do and the patterns, first
    rows and inverse come out the same. ``axis=0`` sorts a void view of the rows, ~10× the
    time of the packed sort (~0.1 ms a window's group on bench case (b)); rows of more than 31
    columns take it still."""
    if kind.ndim != 2 or not 0 < kind.shape[1] <= 31:
        patterns, first, inverse = np.unique(kind, axis=0, return_index=True, return_inverse=True)
        return patterns, first, inverse.reshape(-1)
    weights = np.left_shift(np.int64(1), 2 * np.arange(kind.shape[1] - 1, -1, -1, dtype=np.int64))
    codes = kind.astype(np.int64) @ weights
    _, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
    return kind[first], first, inverse.reshape(-1)


class ResultStore:
    """Append-only columns of pair results (one home for "what a compared pair keeps").

    ``spill``: a directory for the full chunks (see the module's docstring); None keeps every
    chunk in RAM. ``keep``: name the spill files (``spill_paths``) and leave them at close."""

    def __init__(
        self,
        spill: str | os.PathLike[str] | None = None,
        *,
        keep: bool = False,
        extra: np.dtype | None = None,
    ) -> None:
        self.dtype = ROW if extra is None else np.dtype(ROW.descr + extra.descr)
        """:data:`ROW`, then the ``extra`` fields a user of the store keeps beside each pair
        (the live session's CSV statistics, engine/session/settled.py): stored, spilled and
        read back with the row, filled by :meth:`append`'s ``extra``."""
        self._chunks: list[np.ndarray | None] = []
        """A spilled chunk is None here and lives in ``_spill_rows``."""
        self._n = 0
        self._pool: list[np.ndarray | None] = []
        self._pool_n = 0
        self.strings = Strings()
        """Node names, stems, node types, reasons, paths, dtypes."""
        self.shapes = Strings()
        self.failed_sets = Strings()
        self.metric_sets = Strings()
        self._side_ids: dict[tuple[Any, ...], tuple[int, int, int]] = {}
        """(path, token, dtype, shape) → a side's path, shape and dtype ids: one lookup a side
        instead of three ids and the path's token directory found again."""
        """Tuples of ``(name, 0.0 | 1.0 | None)``: None means the value is in the pool."""
        self.counts: Counter[Verdict] = Counter()
        self.strings.id("")  # id 0: no reason, no type
        self.spill_dir = None if spill is None else Path(spill)
        self._files: list[_Spilled] = []
        if self.spill_dir is not None:
            self._files = [
                _Spilled(self.spill_dir, "rows", self.dtype, CHUNK, keep),
                _Spilled(self.spill_dir, "pool", np.dtype("<f8"), POOL_CHUNK, keep),
            ]
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        """Reads of spilled rows by ``i // READ_ROWS``."""
        self._lock = threading.Lock()
        # Only spill files need closing: an in-RAM store (each window's session of a compare
        # makes one) registers no finalizer, whose callback run by a collection would swallow
        # a Ctrl-C that lands in it ("Exception ignored"), and the compare would not stop.
        self._closer = weakref.finalize(self, _close_all, self._files) if self._files else None

    def __len__(self) -> int:
        return self._n

    @property
    def nbytes(self) -> int:
        """Bytes of the columns and the value pool held in RAM (not the tables of distinct
        strings, not the spilled chunks: :attr:`disk_bytes`)."""
        held = [c for c in (*self._chunks, *self._pool) if c is not None]
        return sum(c.nbytes for c in held)

    @property
    def disk_bytes(self) -> int:
        """Bytes written to the spill files."""
        return sum(f.nbytes for f in self._files)

    @property
    def spill_paths(self) -> tuple[Path, ...]:
        """The kept spill files (rows, then pool values); empty unless ``keep``."""
        return tuple(f.path for f in self._files if f.path is not None)

    def close(self) -> None:
        """Give the spill files' disk space back (kept files stay); reading spilled pairs
        after this fails. A store without spill has nothing to close."""
        if self._closer is not None:
            self._closer()

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- writing ----------------------------------------------------------------------------
    def append(
        self, results: Iterable[PairResult], extra: Sequence[tuple[Any, ...]] | None = None
    ) -> None:
        """Store ``results`` (a window's worth at a time: rows are built as tuples and copied
        into the chunks in slices, ~2 µs a pair); ``extra``: each pair's values of the store's
        ``extra`` fields. With spill, chunks that filled up are written out after (a failed
        write leaves them in RAM and raises the one line)."""
        results = results if isinstance(results, list) else list(results)
        if not results:
            return
        msets, positions = self._metric_rows(results)
        rows = [self._tuple(r, m, p) for r, m, p in zip(results, msets, positions, strict=True)]
        if extra is not None:
            rows = [row + more for row, more in zip(rows, extra, strict=True)]
        batch = np.array(rows, dtype=self.dtype)
        done = 0
        while done < len(batch):
            if self._n == len(self._chunks) * CHUNK:
                self._chunks.append(np.zeros(CHUNK, self.dtype))
            at = self._n % CHUNK
            take = min(CHUNK - at, len(batch) - done)
            chunk = self._chunks[-1]
            assert chunk is not None  # the chunk being filled is never spilled
            chunk[at : at + take] = batch[done : done + take]
            done += take
            self._n += take
        if self._files:
            self._spill(self._chunks, self._n // CHUNK, self._files[0])
            self._spill(self._pool, self._pool_n // POOL_CHUNK, self._files[1])

    @staticmethod
    def _spill(chunks: list[np.ndarray | None], full: int, file: _Spilled) -> None:
        for k in range(file.chunks, full):
            chunk = chunks[k]
            if chunk is not None:
                file.write(k, chunk)
                chunks[k] = None

    def _metric_rows(self, results: list[PairResult]) -> tuple[list[int], list[int]]:
        """Each pair's metric set id and where its other values start in the pool, with
        those values appended to the pool: the same ids (in order of first use) and the same
        pool as a pair at a time (a metric exactly +0.0 or 1.0 is kept in the set, the others
        in the pool, in the pair's order), from numpy over the pairs that share metric names
        (~16 Python steps a pair before)."""
        groups: dict[tuple[str, ...], list[int]] = {}
        for i, result in enumerate(results):
            groups.setdefault(tuple(result.metrics), []).append(i)
        counts = np.zeros(len(results), np.int64)
        found: list[tuple[int, np.ndarray, tuple[tuple[str, float | None], ...]]] = []
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        for names, rows in groups.items():
            if not names:
                found.append((rows[0], np.asarray(rows), ()))
                continue
            values = np.array([list(results[i].metrics.values()) for i in rows], np.float64)
            zero, one = (values == 0.0) & ~np.signbit(values), values == 1.0
            kind = zero.view(np.int8) + 2 * one.view(np.int8)  # 0 pool, 1 is +0.0, 2 is 1.0
            patterns, first, inverse = _unique_rows(kind)
            where = np.asarray(rows)
            for p, pattern in enumerate(patterns.tolist()):
                mset = tuple(
                    (name, None if k == 0 else float(k - 1))
                    for name, k in zip(names, pattern, strict=True)
                )
                found.append((rows[int(first[p])], where[inverse == p], mset))
            pooled = kind == 0
            counts[where] = pooled.sum(axis=1)
            parts.append((where, pooled, values))
        ids = np.zeros(len(results), np.int64)
        for _, where, mset in sorted(found, key=lambda f: f[0]):  # ids in order of first use
            ids[where] = self.metric_sets.id(mset)
        starts = np.zeros(len(results), np.int64)
        np.cumsum(counts[:-1], out=starts[1:])
        total = int(counts.sum())
        if total:
            pool = np.empty(total, np.float64)
            for where, pooled, values in parts:
                taken = values[pooled]  # row by row, each row's values in its order
                n = counts[where]
                before = np.zeros(len(where), np.int64)
                np.cumsum(n[:-1], out=before[1:])
                pool[np.repeat(starts[where] - before, n) + np.arange(len(taken))] = taken
            self._put_many(pool)
        return ids.tolist(), (starts + (self._pool_n - total)).tolist()

    def _tuple(self, result: PairResult, mset: int, pos: int) -> tuple[Any, ...]:
        key = result.key
        s = self.strings.id
        seen = self.strings.seen  # a known value's id; 0 or None: ask s() (same id)
        self.counts[result.verdict] += 1
        return (
            key.token,
            key.rank,
            _VERDICT_ID[result.verdict],
            result.is_logits,
            seen(key.node) or s(key.node),
            seen(key.stem) or s(key.stem),
            result.order,
            result.block,
            seen(result.node_type) or s(result.node_type),
            seen(result.reason) or s(result.reason),
            self.failed_sets.id(tuple(result.failed)),
            mset,
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
            return (
                NO_PAYLOAD,
                0,
                0,
                self.shapes.id(tuple(record.shape)),
                self.strings.id(record.dtype),
            )
        at = (loc.path, token, loc.dtype, loc.shape)
        try:
            ids, hashable = self._side_ids.get(at), True
        except TypeError:  # a shape given as a list
            ids, hashable = None, False
        if ids is None:  # (a miss is the rule for per-tensor files: no exception raised for it)
            ids = (
                self._path_id(loc.path, token),
                self.shapes.id(tuple(loc.shape)),
                self.strings.id(loc.dtype),
            )
            if len(self._side_ids) >= SIDE_IDS:
                self._side_ids.clear()
            if hashable:
                self._side_ids[at] = ids
        return (ids[0], loc.offset, loc.nbytes, ids[1], ids[2])

    def _put_many(self, values: np.ndarray | list[float]) -> None:
        """Append a pair's metric values to the pool (one slice per chunk they fall in, not a
        call per value: ~9 values a pair)."""
        done = 0
        while done < len(values):
            if self._pool_n == len(self._pool) * POOL_CHUNK:
                self._pool.append(np.zeros(POOL_CHUNK, "<f8"))
            pool = self._pool[-1]
            assert pool is not None  # the pool chunk being filled is never spilled
            at = self._pool_n % POOL_CHUNK
            take = min(POOL_CHUNK - at, len(values) - done)
            pool[at : at + take] = values[done : done + take]
            done += take
            self._pool_n += take

    # --- reading ----------------------------------------------------------------------------
    def _spilled_rows(self, block: int, step: int) -> np.ndarray:
        with self._lock:
            found = self._cache.get(block)
            if found is not None:
                self._cache.move_to_end(block)
                return found
        rows = self._files[0].read(block * step, step)
        with self._lock:
            self._cache[block] = rows
            while len(self._cache) > CACHED:
                self._cache.popitem(last=False)
        return rows

    def _values(self, pos: int, count: int) -> list[float]:
        """``count`` metric values from ``pos`` of the pool (one read where all are on disk)."""
        if self._files and pos + count <= self._files[1].chunks * POOL_CHUNK:
            return self._files[1].read(pos, count).tolist()
        out: list[float] = []
        at, stop = pos, pos + count
        while at < stop:
            k, i = divmod(at, POOL_CHUNK)
            take = min(stop - at, POOL_CHUNK - i)
            chunk = self._pool[k]
            out += (
                self._files[1].read(at, take).tolist()
                if chunk is None
                else chunk[i : i + take].tolist()
            )
            at += take
        return out

    def rows_between(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` as one array (a copy; spilled rows read straight from the
        file, not through the cache): a live session's token, a few thousand rows."""
        if not 0 <= start <= stop <= self._n:
            raise IndexError((start, stop))
        out = np.empty(stop - start, self.dtype)
        for i, k, at, take in self._spans(start, stop):
            chunk = self._chunks[k]
            if chunk is not None:
                out[i - start : i - start + take] = chunk[at : at + take]
            else:
                out[i - start : i - start + take] = self._files[0].read(i, take)
        return out

    @staticmethod
    def _spans(start: int, stop: int) -> Iterator[tuple[int, int, int, int]]:
        """Rows ``[start, stop)`` cut at chunk edges: (first row, chunk, row in it, rows)."""
        i = start
        while i < stop:
            k, at = divmod(i, CHUNK)
            take = min(stop - i, CHUNK - at)
            yield i, k, at, take
            i += take

    def set_column(self, start: int, name: str, values: np.ndarray) -> None:
        """Overwrite column ``name`` of rows ``start`` on (the live session re-places its rows
        when the grid's columns change: rare). Spilled rows are read, changed and written back
        where they were."""
        stop = start + len(values)
        rows = self.rows_between(start, stop)
        rows[name] = values
        for i, k, at, take in self._spans(start, stop):
            chunk = self._chunks[k]
            if chunk is not None:
                chunk[at : at + take] = rows[i - start : i - start + take]
            else:
                self._files[0].write_at(i, rows[i - start : i - start + take])
        with self._lock:
            self._cache.clear()

    def _row(self, i: int) -> np.void:
        if not 0 <= i < self._n:
            raise IndexError(i)
        chunk = self._chunks[i // CHUNK]
        if chunk is not None:
            return chunk[i % CHUNK]
        step = min(READ_ROWS, CHUNK)  # both powers of two: a read never leaves its chunk
        return self._spilled_rows(i // step, step)[i % step]

    def column(self, name: str) -> np.ndarray:
        """One column over every stored pair (a copy; spilled rows are read a slice at a time
        and not cached, so a scan does not hold the store in RAM)."""
        out = np.empty(len(self._chunks) * CHUNK, self.dtype[name])
        step = min(READ_ROWS, CHUNK)
        for k, chunk in enumerate(self._chunks):
            if chunk is not None:
                out[k * CHUNK : (k + 1) * CHUNK] = chunk[name]
                continue
            for at in range(k * CHUNK, (k + 1) * CHUNK, step):
                out[at : at + step] = self._files[0].read(at, step)[name]
        return out[: self._n]

    def metrics(self, i: int) -> dict[str, float]:
        row = self._row(i)
        names = self.metric_sets.values[int(row["mset"])]
        values = iter(self._values(int(row["mpos"]), sum(c is None for _, c in names)))
        return {name: next(values) if const is None else const for name, const in names}

    def key(self, i: int) -> TensorKey:
        row = self._row(i)
        v = self.strings.values
        return TensorKey(int(row["token"]), v[row["node"]], v[row["stem"]], int(row["rank"]))

    def verdict(self, i: int) -> Verdict:
        return VERDICTS[int(self._row(i)["verdict"])]

    def row(self, i: int) -> dict[str, Any]:
        """The pair's ``--json`` row (``PairResult.to_json``'s shape, non-finite metrics kept)."""
        row = self._row(i)
        key = self.key(i)
        return {
            "token": key.token,
            "node": key.node,
            "tensor": key.stem,
            "rank": key.rank,
            "verdict": VERDICTS[int(row["verdict"])].value,
            "metrics": self.metrics(i),
            "reason": self.strings.values[row["reason"]],
        }

    def record(self, i: int, side: str) -> TensorRecord | None:
        """What is needed to load the pair's ``side`` again (``golden``/``target``); None when
        the pair has no tensor on that side."""
        row = self._row(i)
        p = side[0]
        return self._record(
            self.key(i),
            self.strings.values[row["node_type"]],
            int(row[f"{p}_path"]),
            int(row[f"{p}_offset"]),
            int(row[f"{p}_nbytes"]),
            self.strings.values[row[f"{p}_dtype"]],
            self.shapes.values[row[f"{p}_shape"]],
        )

    def _record(
        self,
        key: TensorKey,
        node_type: str,
        path: int,
        offset: int,
        nbytes: int,
        dtype: str,
        shape: tuple[int, ...],
    ) -> TensorRecord | None:
        """A side's record from its stored fields (:meth:`record`, :meth:`results_between`)."""
        if path == NO_TENSOR:
            return None
        loc = None
        if path >= 0:
            loc = Locator(
                self.strings.values[path].replace(TOKEN_MARK, str(key.token)),
                offset,
                nbytes,
                dtype,
                shape,
            )
        return TensorRecord(key, dtype, shape, loc, node_type=node_type)

    def result(self, i: int) -> PairResult:
        """The pair as a PairResult (records without statistics: compare again for those)."""
        return self.results_between(i, i + 1)[0][0]

    def results_between(self, start: int, stop: int) -> tuple[list[PairResult], np.ndarray]:
        """Rows ``[start, stop)`` as :meth:`result` gives them, and the rows themselves: one
        read of the rows and one of their metric values, columns turned into lists once (a
        live report reads back every pair; a field of a row read one at a time cost ~25 numpy
        scalar reads a pair)."""
        rows = self.rows_between(start, stop)
        if not len(rows):
            return [], rows
        col = self.columns(rows)
        v, shapes, fsets = self.strings.values, self.shapes.values, self.failed_sets.values
        out = []
        for j, metrics in enumerate(self.metric_dicts(col)):
            token = col["token"][j]
            key = TensorKey(token, v[col["node"][j]], v[col["stem"][j]], col["rank"][j])
            node_type = v[col["node_type"][j]]
            sides = [
                self._record(
                    key,
                    node_type,
                    col[f"{p}_path"][j],
                    col[f"{p}_offset"][j],
                    col[f"{p}_nbytes"][j],
                    v[col[f"{p}_dtype"][j]],
                    shapes[col[f"{p}_shape"][j]],
                )
                for p in "gt"
            ]
            out.append(
                PairResult(
                    key,
                    VERDICTS[col["verdict"][j]],
                    metrics,
                    fsets[col["failed"][j]],
                    v[col["reason"][j]],
                    sides[0],
                    sides[1],
                    order=col["order"][j],
                    node_type=node_type,
                    block=col["block"][j],
                    is_logits=bool(col["logits"][j]),
                )
            )
        return out, rows

    def columns(self, rows: np.ndarray) -> dict[str, list[Any]]:
        """Each field of ``rows`` (from :meth:`rows_between`) as a list."""
        return {name: rows[name].tolist() for name in rows.dtype.names or ()}

    def metric_dicts(self, col: dict[str, list[Any]]) -> Iterator[dict[str, float]]:
        """Each row's metrics (``col``: :meth:`columns` of consecutive rows), their values
        read from the pool once for all of them where they lie together."""
        sets = self.metric_sets.values
        for m, got in zip(col["mset"], self._pooled(col), strict=True):
            values = iter(got)
            yield {name: next(values) if const is None else const for name, const in sets[m]}

    def metric_lists(
        self, col: dict[str, list[Any]], names: Sequence[str]
    ) -> list[list[float | None]]:
        """Each row's values of ``names`` (None: not measured): what :meth:`metric_dicts`'
        dict gives for them, without the dict (a report line's values: ``settled.line_fields``).
        Where the rows' pooled values lie together (a token's rows, as stored), they are taken
        with numpy a metric set at a time into one table of Python objects (a list
        comprehension a row was ~3 % of ``open --headless``'s report on many small pairs)."""
        msets = col["mset"]
        sets = self.metric_sets.values
        plans = {}  # metric set → per name: (its offset among the pooled values, or -1; constant)
        for m in set(msets):
            at: dict[str, tuple[int, float | None]] = {}
            pooled = 0
            for name, const in sets[m]:
                if const is None:
                    at[name] = (pooled, None)
                    pooled += 1
                else:
                    at[name] = (-1, const)
            plans[m] = [at.get(name, (-1, None)) for name in names]
        spanned = self._span(col)
        _, lo, span = spanned
        if span is None:  # far apart: each row's values read by themselves
            return [
                [got[k] if k >= 0 else const for k, const in plans[m]]
                for m, got in zip(msets, self._pooled(col, spanned), strict=True)
            ]
        pool = np.array(span, np.float64)
        of_row, pos = np.array(msets, np.int64), np.array(col["mpos"], np.int64) - lo
        out = np.empty((len(msets), len(names)), object)
        for m, plan in plans.items():
            rows = np.flatnonzero(of_row == m)
            taken = [j for j, (k, _) in enumerate(plan) if k >= 0]
            if taken:
                ks = np.array([plan[j][0] for j in taken], np.int64)
                # astype(object): Python floats (the pool's tolist gives the same ones)
                out[rows[:, None], taken] = pool[pos[rows][:, None] + ks].astype(object)
            for j, (k, const) in enumerate(plan):
                if k < 0:
                    out[rows, j] = const
        return out.tolist()

    def _span(self, col: dict[str, list[Any]]) -> tuple[list[int], int, list[float] | None]:
        """Each row's count of pooled values, and the pool from the rows' first such value to
        their last (from ``lo``) when that span is not much more than theirs (else None)."""
        sets = self.metric_sets.values
        count_of = {m: sum(c is None for _, c in sets[m]) for m in set(col["mset"])}
        counts = [count_of[m] for m in col["mset"]]
        mpos = col["mpos"]
        lo = min(p for p, c in zip(mpos, counts, strict=True) if c) if any(counts) else 0
        hi = max((p + c for p, c in zip(mpos, counts, strict=True) if c), default=lo)
        span = self._values(lo, hi - lo) if hi - lo <= 2 * sum(counts) + 4096 else None
        return counts, lo, span

    def _pooled(
        self,
        col: dict[str, list[Any]],
        spanned: tuple[list[int], int, list[float] | None] | None = None,
    ) -> Iterator[list[float]]:
        """Each row's pooled metric values (those not exactly +0.0 or 1.0), in its set's order
        (``spanned``: :meth:`_span` of ``col``, when the caller has it already)."""
        counts, lo, span = spanned or self._span(col)
        for count, pos in zip(counts, col["mpos"], strict=True):
            yield (
                span[pos - lo : pos - lo + count] if span is not None else self._values(pos, count)
            )

    def rows(self, indices: Sequence[int] | None = None) -> Iterator[dict[str, Any]]:
        for i in range(self._n) if indices is None else indices:
            yield self.row(i)
