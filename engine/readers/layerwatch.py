"""Reader for layerwatch's own dump format (``capture/format.py``), finished or still growing.

The index is tailed by byte offset: only complete lines count (a trailing partial line is left
for the next poll), and an index line is written only after its data file was renamed into
place, so every record handed out points at bytes that are on disk.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from layerwatch.capture import format as lwf
from layerwatch.capture.errors import LayerwatchError
from layerwatch.capture.framing import whole_lines
from layerwatch.engine import orjson_lazy
from layerwatch.engine.readers.base import (
    DirectoryReader,
    RankIndex,
    ReaderUpdate,
    is_rank_dir_name,
    scandir,
    stats_from,
)
from layerwatch.engine.readers.index_columns import (
    IndexColumns,
    NameTable,
    NodeMatch,
    TokenSpans,
    iter_lines,
    lines_in,
    scan_file,
    tensor_lines,
)
from layerwatch.engine.readers.load import canonical_dtype
from layerwatch.engine.readers.locate import detect as detect
from layerwatch.engine.readers.locate import is_rank_dir
from layerwatch.engine.records import (
    Locator,
    ParamPrint,
    TensorKey,
    TensorRecord,
    Topology,
    plain_locator,
)

_new_tuple = tuple.__new__
DECODE_LINES = 512
"""Index lines decoded by one ``json.loads`` (a block, so a big index never becomes one list)."""
ORJSON_LINES = 2048
"""Lines of one decode call from which orjson decodes them (imported then, if not yet): its
import (~4 ms, with the ``datetime`` and ``uuid`` modules it brings) costs what ~2 000 lines
decoded by ``json`` instead of orjson cost (1.96 against 0.86 µs a bench line, and ~0.2 for the
:data:`_BIG_RUN` check), so a small index does not pay it. Once imported (here, by
``engine/floattext.py`` or anything else; ``engine/orjson_lazy.py``) every block uses it."""
_BIG_INT = bytes.maketrans(b"0123456789:,[- \t\r\n", b"0000000000||||||||")
"""Digits to ``0`` and what may stand before a number's digits (a separator, its sign,
whitespace) to ``|``: a number of 19 digits or more then reads ``|`` and 19 zeros."""
_BIG_RUN = b"|" + b"0" * 19
"""orjson turns an integer beyond 64 bits into a float (``json``: an exact int). Such a
literal has at least 19 digits after a separator or sign; a block holding one (or anything
that looks like it: a long fraction has a ``.`` before its digits and does not) goes to
``json``."""
FORCED_NOTES = 3
"""Teacher-forced flips noted per rank (the first ones matter; the rest would be noise)."""


@dataclass(slots=True)
class _Rank:
    path: Path
    rank: int
    offset: int = 0
    """Bytes of ``index.jsonl`` consumed (always at a line boundary)."""
    topo_sig: tuple[int, int] | None = None
    ended: bool = False
    seen: dict[int, set[TensorKey]] = field(default_factory=dict)
    """Keys handed out, by token (a key repeated in the index is handed out once)."""
    torn_noted: bool = False
    """The final scan said that the last index line is cut short."""
    forced: int = 0
    """Steps at which ``follow`` fed the golden's token instead of the target's own choice."""
    files: dict[str, str] = field(default_factory=dict)
    """Data file name in the index → its path."""


@dataclass(slots=True)
class IndexScan:
    """Line counts by kind over every rank's index (``scan_index``)."""

    tensors: int = 0
    tokens: int = 0
    cases: int = 0
    drops: int = 0
    rows: int = 0
    """Tensor lines kept a row each (an index out of token order); 0 when folded per token."""

    def add(self, lines: bytes) -> None:
        self.tensors += lines.count(b'"k":"t"')
        self.tokens += lines.count(b'"k":"token"')
        self.cases += lines.count(b'"k":"case')
        self.drops += lines.count(b'"k":"drop"')


class LayerwatchReader(DirectoryReader):
    """Reads ``{dump}/{device}_{pid}/index.jsonl`` (+ topology) incrementally."""

    fmt = "layerwatch"

    def __init__(self, root: Path) -> None:
        self.root = root
        self._single = is_rank_dir(root)
        self._run_dir = root.parent if self._single else root
        self._ranks: dict[str, _Rank] = {}
        self._index = RankIndex()
        self._complete = False
        self._names: dict[str, str] = {}
        self._dtypes: dict[str, str] = {}
        self._shapes: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._opened: IndexTable | None = None
        """The column table ``scan_index`` opened, until ``open_columns`` takes it."""

    # --- polling -------------------------------------------------------------------------
    def poll(self, changed: Sequence[Path] | None = None, *, final: bool = False) -> ReaderUpdate:
        update = ReaderUpdate()
        self._opened = None  # records come from here now: no column table is kept
        if self._gone(update):
            update.complete = self._complete
            return update
        if changed is None:
            for state in self._discover():
                self._read_topology(state, update)
                self._read_index(state, update, final)
        else:
            for path in changed:
                self._on_change(Path(os.path.abspath(path)), update)
        if self._ranks and all(s.ended for s in self._ranks.values()) and not self._complete:
            self._complete = True
        update.complete = self._complete
        return update

    def poll_chunk(self, limit: int) -> ReaderUpdate | None:
        """The next at most ``limit`` bytes of each rank's index of a finished dump (whole lines
        only), or None once every index is consumed: ``compare`` reads big dumps a window of
        tokens at a time instead of holding every record (``engine/session/windowed.py``)."""
        update = ReaderUpdate()
        if self._gone(update):
            return update if update else None
        states = self._discover()
        moved = False
        for state in states:
            if state.topo_sig is None:
                self._read_topology(state, update)
            before = state.offset
            self._read_index(state, update, final=True, limit=limit)
            moved |= state.offset != before
        if not moved and not update:
            return None
        return update

    def forget_before(self, token: int) -> None:
        """Stop remembering the keys of tokens before ``token`` (a windowed compare has judged
        them): a key of theirs met again is handed out again, as a late record."""
        for state in self._ranks.values():
            for old in [t for t in state.seen if t < token]:
                del state.seen[old]

    def scan_index(self, nodes: str | None = None) -> IndexScan:
        """Count what the indexes hold: how big a compare will be, and whether it needs every
        record at once (cases, dropped files). Opens the column table to count (as fast as
        counting the bytes) and keeps it for the next :meth:`open_columns`: per token (an index
        in token order keeps no row a tensor), ``nodes`` (``--nodes``) applied."""
        self._opened = self.open_columns(per_token=True, nodes=nodes)
        return self._opened.scan

    def has_case_lines(self) -> bool:
        """Whether any rank's index has a case line, found by its bytes (``open`` asks before
        its live session reads the index: opening the columns to count would scan it twice)."""
        mark = b'"k":"case'
        for state in self._discover():
            try:
                with open(state.path / lwf.INDEX, "rb") as fh:
                    tail = b""
                    while block := fh.read(8 << 20):
                        if mark in tail + block[: len(mark) - 1] or mark in block:
                            return True
                        tail = block[-(len(mark) - 1) :]
            except OSError:
                continue
        return False

    def open_columns(self, *, per_token: bool = False, nodes: str | None = None) -> IndexTable:
        """Every rank's finished index as columns (``index_columns.py``): token, node and stem
        of each tensor line and where the line is, scanned without decoding it; the other lines
        (token ids, weights, cases, drops, end, errors) decoded now, in index order. Records
        are built later, a window of tokens at a time (:meth:`IndexTable.records`). The poll
        cursor does not move: this is for finished dumps, ``poll`` for growing ones.
        ``per_token``: a rank in token order is kept as its tokens' byte ranges from the start
        (``scan_file``), an index out of order as rows; ``nodes``: only those nodes' lines
        (:meth:`IndexTable.only_nodes`)."""
        if self._opened is not None:  # opened by scan_index
            table, self._opened = self._opened, None
            return table
        table = IndexTable(self, NameTable(), nodes=nodes or None)
        for state in self._discover():
            topo = ReaderUpdate()
            self._read_topology(_Rank(state.path, state.rank), topo)
            table.head.topology = topo.topology or table.head.topology
            table.head.notes.extend(topo.notes)
            index = state.path / lwf.INDEX
            try:
                cols = scan_file(index, table.names, per_token=per_token, nodes=nodes)
                if nodes and not per_token:
                    cols = cols.keep_nodes(nodes, table.names)
            except FileNotFoundError:
                continue
            except OSError as exc:
                table.head.notes.append(f"{index}: cannot read: {exc.strerror}")
                continue
            side = _Rank(state.path, state.rank, files=state.files)
            table.scan.tensors += cols.scanned
            table.scan.rows += len(cols.token)
            for offset, line in cols.extra:
                table.scan.add(line)
                if line.startswith(b'{"k":"drop"'):
                    with contextlib.suppress(ValueError, AttributeError):
                        gone = os.path.join(state.path, str(json.loads(line).get("file", "")))
                        table.dropped.setdefault(gone, offset)
                self._decode(side, [line], table.head, _at_byte(offset))
            if cols.torn:
                table.head.notes.append(f"{index}: last line cut short, skipped")
            table.ranks.append((side, cols))
        table.head.complete = bool(table.ranks) and all(s.ended for s, _ in table.ranks)
        return table

    def _discover(self) -> list[_Rank]:
        if self._single:
            names = [self.root.name]
        else:
            names = [
                e.name
                for e in scandir(self._run_dir)
                if e.is_dir() and (is_rank_dir_name(e.name) or is_rank_dir(Path(e.path)))
            ]
            names = [n for n in names if is_rank_dir(self._run_dir / n)]
        self._index.assign(names)
        for name in names:
            if name not in self._ranks:
                self._ranks[name] = _Rank(self._run_dir / name, self._index(name))
        return list(self._ranks.values())

    def _on_change(self, path: Path, update: ReaderUpdate) -> None:
        if path == self.root or path == self._run_dir:
            for state in self._discover():
                self._read_topology(state, update)
                self._read_index(state, update)
            return
        rank_dir = path
        while rank_dir.parent != self._run_dir and rank_dir.parent != rank_dir:
            rank_dir = rank_dir.parent
        if rank_dir.parent != self._run_dir or (self._single and rank_dir != self.root):
            return
        found = self._ranks.get(rank_dir.name)
        if found is None:
            if not is_rank_dir(rank_dir):
                return  # a rank directory whose index does not exist yet
            self._discover()
            found = self._ranks.get(rank_dir.name)
            if found is None:
                return
        state = found
        name = path.name
        if path == rank_dir or name in (lwf.INDEX, lwf.MANIFEST):
            self._read_topology(state, update)
            self._read_index(state, update)
        elif name == lwf.TOPOLOGY:
            self._read_topology(state, update)

    # --- index -----------------------------------------------------------------------------
    def _read_index(
        self, state: _Rank, update: ReaderUpdate, final: bool = False, limit: int | None = None
    ) -> None:
        try:
            with open(state.path / lwf.INDEX, "rb") as fh:
                fh.seek(state.offset)
                chunk = fh.read() if limit is None else fh.read(limit)
                if limit is not None and len(chunk) == limit:
                    final = False  # more to come: a cut line here is the chunk's edge
                    if not whole_lines(chunk):  # one line longer than the chunk
                        chunk += fh.readline()
        except FileNotFoundError:
            return
        except OSError as exc:
            update.notes.append(f"{state.path / lwf.INDEX}: cannot read: {exc.strerror}")
            return
        whole = whole_lines(chunk)
        if final and chunk[whole:].strip() and not state.torn_noted:
            # The writer finished (killed mid-line?): this line will never be completed.
            state.torn_noted = True
            update.notes.append(f"{state.path / lwf.INDEX}: last line cut short, skipped")
        if not whole:
            return  # only a partial line so far
        start_offset = state.offset
        state.offset += whole
        self._decode(
            state,
            chunk[:whole].splitlines(),
            update,
            lambda i: f"line {i + 1} after byte {start_offset}",
        )

    def _decode(
        self, state: _Rank, lines: list[bytes], update: ReaderUpdate, where: Callable[[int], str]
    ) -> None:
        """Apply index lines in order; a corrupt one is a note saying ``where(i)`` it is."""
        fast = _fast_json(len(lines))
        for first in range(0, len(lines), DECODE_LINES):
            block = lines[first : first + DECODE_LINES]
            # one decode call for a block of lines: a third of the per-line cost
            text = b"[" + b",".join(line for line in block if line.strip()) + b"]"
            objs = None
            if fast is not None and text.translate(_BIG_INT).find(_BIG_RUN) < 0:
                # orjson refuses NaN/Infinity, lone surrogates, a BOM and numbers out of
                # float range, where json accepts them: such a block takes json's path
                with contextlib.suppress(ValueError):
                    objs = fast(text)
            if objs is None:
                try:
                    objs = json.loads(text)
                except ValueError:
                    objs = None
            if isinstance(objs, list):
                apply = self._apply
                for obj in objs:
                    apply(state, obj, update)
                continue
            for lineno, line in enumerate(block, first):  # a corrupt line in the block
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except ValueError:
                    update.notes.append(
                        f"{state.path / lwf.INDEX}: skipped a corrupt index line ({where(lineno)})"
                    )
                    continue
                self._apply(state, obj, update)

    def _apply(self, state: _Rank, obj: dict, update: ReaderUpdate) -> None:
        kind = obj.get("k")
        if kind == lwf.K_TENSOR:
            try:
                record = self._tensor_record(state, obj)
            except (KeyError, TypeError, ValueError, LayerwatchError) as exc:
                update.notes.append(f"{state.path / lwf.INDEX}: skipped a bad tensor line ({exc})")
                return
            key = record.key
            seen = state.seen.get(key.token)
            if seen is None:
                seen = state.seen[key.token] = set()
            if key not in seen:
                seen.add(key)
                update.tensors.append(record)
        elif kind == lwf.K_TOKEN:
            try:
                update.token_ids[int(obj["token"])] = tuple(
                    int(i)
                    for i in obj.get("input_ids") or ()  # null: the root took no ids
                )
            except (KeyError, TypeError, ValueError):
                update.notes.append(f"{state.path / lwf.INDEX}: skipped a bad token line")
        elif kind in (lwf.K_CASE, lwf.K_CASE_END):
            if isinstance(obj.get("token"), int) and obj.get("key") is not None:
                update.case_marks.append((kind, str(obj["key"]), obj["token"]))
        elif kind == lwf.K_FOLLOW:
            own, fed = obj.get("own_id"), obj.get("fed_id")
            if own != fed:
                state.forced += 1
                if state.forced <= FORCED_NOTES:
                    update.notes.append(
                        f"{state.path.name}: token {obj.get('token')}: the target chose {own}, "
                        f"--follow fed the golden's {fed}"
                    )
        elif kind == lwf.K_END:
            state.ended = True
            status = obj.get("status", lwf.STATUS_COMPLETE)
            if status != lwf.STATUS_COMPLETE:
                update.notes.append(f"{state.path.name}: capture stopped: {status}")
        elif kind == lwf.K_DROP:  # statistics-first capture deleted this data file
            gone = os.path.join(state.path, str(obj.get("file", "")))
            for record in update.tensors:
                if record.loc is not None and record.loc.path == gone:
                    record.loc = None  # its statistics stay
        elif kind == lwf.K_ERROR:
            update.notes.append(f"{state.path.name}: capture error: {obj.get('message', '?')}")
        elif kind == "weight":
            try:
                name = str(obj["name"])
                update.weights[name] = Locator(
                    str(state.path / obj["file"]),
                    int(obj["begin"]),
                    int(obj["end"]) - int(obj["begin"]),
                    canonical_dtype(str(obj["dtype"])),
                    tuple(int(d) for d in obj["shape"]),
                )
            except (KeyError, TypeError, ValueError, LayerwatchError) as exc:
                update.notes.append(f"{state.path / lwf.INDEX}: skipped a bad weight line ({exc})")

    def _tensor_record(self, state: _Rank, obj: dict) -> TensorRecord:
        """A tensor line → record without the ``IndexTensor`` step (same checks as its
        ``from_json``): opening a big index spends most of its time here. Names, dtypes and
        node types repeat on every token, so one string object each is shared."""
        names = self._names
        get = obj.get
        # a name seen before is its shared string at once (a str equals only a str key);
        # anything else is made a string as before
        node, stem, kind = obj["node"], obj["stem"], get("type", "")
        try:
            node, stem, kind = names[node], names[stem], names[kind]
        except (KeyError, TypeError):
            node, stem, kind = str(node), str(stem), str(kind)
            node = names.setdefault(node, node)
            stem = names.setdefault(stem, stem)
            kind = names.setdefault(kind, kind)
        raw_dtype = str(obj["dtype"])
        dtype = self._dtypes.get(raw_dtype) or self._dtypes.setdefault(
            raw_dtype, canonical_dtype(raw_dtype)
        )
        raw_shape = obj["shape"]
        try:  # a shape seen before: a hit equals a tuple of ints, what the loop below makes
            shape = self._shapes[tuple(raw_shape)]
        except (KeyError, TypeError):
            shape = tuple(int(d) for d in raw_shape)
            shape = self._shapes.setdefault(shape, shape)
        # TensorKey(token, node, stem, rank) without the named tuple's Python-level __new__
        key = _new_tuple(TensorKey, (int(obj["token"]), node, stem, state.rank))
        order = int(get("order", -1))
        file = str(get("file", ""))
        loc = None
        source = ""
        if file:
            begin = int(get("begin", 0))
            source = state.files.get(file) or state.files.setdefault(
                file, os.path.join(state.path, file)
            )  # one string per data file, shared by its records
            loc = plain_locator(source, begin, int(get("end", 0)) - begin, dtype, shape)
        stats = get("stats")  # null in most lines: stats_from's None without the call
        # positional: a dataclass's __init__ with eight keywords costs ~1 µs more
        return TensorRecord(
            key, dtype, shape, loc, stats_from(stats) if stats else None, order, kind, source
        )

    # --- topology ---------------------------------------------------------------------------
    def _read_topology(self, state: _Rank, update: ReaderUpdate) -> None:
        path = state.path / lwf.TOPOLOGY
        try:
            st = path.stat()
        except OSError:
            return
        sig = (st.st_mtime_ns, st.st_size)
        if sig == state.topo_sig:
            return
        try:
            obj = json.loads(path.read_bytes())
            topology = parse_topology(obj)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            update.notes.append(f"{path}: unreadable topology ({exc})")
            return
        state.topo_sig = sig
        update.topology = topology


@dataclass
class IndexTable:
    """A finished layerwatch dump opened as columns (:meth:`LayerwatchReader.open_columns`):
    24 bytes a tensor instead of a ~1.3 KB record, so a 10 M-tensor index opens in seconds."""

    reader: LayerwatchReader
    names: NameTable
    head: ReaderUpdate = field(default_factory=ReaderUpdate)
    """Topology, token ids, weights, case marks, notes and ``complete``: no tensors."""
    ranks: list[tuple[_Rank, IndexColumns]] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    """Data file path → index offset of the ``drop`` line that deleted it."""
    scan: IndexScan = field(default_factory=IndexScan)
    """Line counts by kind (``LayerwatchReader.scan_index``)."""
    spans: list[TokenSpans | None] = field(default_factory=list)
    """Per rank, after :meth:`compact`: its tokens' byte ranges (its columns dropped)."""
    nodes: str | None = None
    """The ``--nodes`` glob applied (:meth:`only_nodes`, or opened with it): a token's lines
    are no longer all its rows, so :meth:`compact` keeps the rows."""
    _sorted: list[tuple[np.ndarray | None, np.ndarray]] | None = None
    _match: NodeMatch | None = None

    @property
    def tensors(self) -> int:
        return sum(
            len(cols) if sp is None else int(sp.count.sum())
            for (_, cols), sp in zip(self.ranks, self._spans(), strict=True)
        )

    def _spans(self) -> list[TokenSpans | None]:
        """Per rank its spans: from :meth:`compact`, or opened per token (``per_token``)."""
        return self.spans or [cols.spans for _, cols in self.ranks]

    def tokens(self) -> np.ndarray:
        """Every tensor line's token (all ranks kept as rows; before :meth:`compact`)."""
        parts = [cols.token for _, cols in self.ranks]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def token_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """(tokens ascending, tensor lines of each), all ranks together."""
        values, counts = [], []
        for (_, cols), sp in zip(self.ranks, self._spans(), strict=True):
            if sp is None:
                v, c = np.unique(cols.token, return_counts=True)
            else:
                v, c = sp.token, sp.count
            values.append(v.astype(np.int64))
            counts.append(c.astype(np.int64))
        if not values:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        allv = np.concatenate(values)
        tokens, inverse = np.unique(allv, return_inverse=True)
        return tokens, np.bincount(inverse.reshape(-1), np.concatenate(counts)).astype(np.int64)

    def compact(self) -> IndexTable:
        """Keep a rank in token order as its tokens' byte ranges instead of a row a tensor
        (a windowed compare reads whole tokens; ~0 bytes a tensor while it runs)."""
        if self.spans or self.nodes is not None:
            return self
        self.spans = [
            cols.token_spans() if cols.spans is None else cols.spans for _, cols in self.ranks
        ]
        self.ranks = [
            (state, cols if sp is None else cols.keep_rows(np.zeros(0, np.int64)))
            for (state, cols), sp in zip(self.ranks, self.spans, strict=True)
        ]
        self._sorted = None
        return self

    def only_nodes(self, pattern: str) -> IndexTable:
        """``--nodes GLOB``: keep the tensor lines of matching nodes (their records are the
        only ones ever built). Opened with ``nodes`` (``scan_index``), the same glob is a no-op."""
        if pattern == self.nodes:
            return self
        if any(sp is not None for sp in self._spans()):
            raise ValueError("only_nodes after compact: the rows are gone")
        self.ranks = [(s, cols.keep_nodes(pattern, self.names)) for s, cols in self.ranks]
        self.nodes = pattern
        self._sorted = None
        return self

    def records(self, low: int, high: int) -> tuple[list[TensorRecord], list[str]]:
        """The records of tokens ``low..high`` (inclusive), rank by rank, token by token, in
        index order within a token; a key repeated in the index is built once. Also the notes
        that building them raised (a line the scan took for a tensor line but JSON refuses)."""
        if self._sorted is None:
            self._sorted = []
            for _, cols in self.ranks:
                order = cols.rows_in_token_order()
                self._sorted.append((order, cols.token if order is None else cols.token[order]))
        update = ReaderUpdate()
        for (state, cols), (order, tokens), sp in zip(
            self.ranks, self._sorted, self._spans(), strict=True
        ):
            if sp is not None:
                self._span_records(state, sp, low, high, update)
                continue
            lo = int(np.searchsorted(tokens, low, "left"))
            hi = int(np.searchsorted(tokens, high, "right"))
            if lo == hi:
                continue
            rows = slice(lo, hi) if order is None else order[lo:hi]
            offsets, lengths = cols.offset[rows], cols.length[rows]
            lines = list(iter_lines(state.path / lwf.INDEX, offsets, lengths))
            at = offsets.tolist()
            side = _Rank(state.path, state.rank, files=state.files)
            self.reader._decode(side, lines, update, _at_bytes(at))
        if self.dropped:
            for record in update.tensors:
                if record.loc is not None and record.loc.path in self.dropped:
                    record.loc = None  # statistics-first capture deleted its data file
        return update.tensors, update.notes

    def _span_records(
        self, state: _Rank, sp: TokenSpans, low: int, high: int, update: ReaderUpdate
    ) -> None:
        i = int(np.searchsorted(sp.token, low, "left"))
        j = int(np.searchsorted(sp.token, high, "right"))
        if i == j:
            return
        begin, end = int(sp.begin[i]), int(sp.end[j - 1])
        with open(state.path / lwf.INDEX, "rb") as fh:
            fh.seek(begin)
            data = fh.read(end - begin)
        if sp.nodes is None:
            lines, at = tensor_lines(data, begin)
        else:  # folded under --nodes: the window's lines scanned again, theirs kept
            if self._match is None or self._match.pattern != sp.nodes:
                self._match = NodeMatch(sp.nodes, self.names)
            lines, at = lines_in(data, begin, self.names, self._match, low, high)
        side = _Rank(state.path, state.rank, files=state.files)
        self.reader._decode(side, lines, update, _at_bytes(at))


def parse_topology(obj: dict) -> Topology:
    """``topology.json`` (``layerwatch-topology`` v1) → :class:`Topology`."""
    topo = Topology(root=str(obj.get("root", "root")))
    for item in obj.get("nodes", ()):
        node = topo.add(
            str(item["name"]),
            str(item.get("type", "")),
            item.get("parent"),
            int(item.get("order", -1)),
        )
        node.cls = str(item.get("class") or node.cls)
        attrs = item.get("attrs")
        if isinstance(attrs, dict):
            node.attrs = dict(attrs)
        for pname, p in (item.get("params") or {}).items():
            node.params[str(pname)] = ParamPrint(
                shape=tuple(int(d) for d in p.get("shape", ())),
                dtype=str(p.get("dtype", "")),
                sum=float(p.get("sum", "nan")),
                abs_sum=float(p.get("abs_sum", "nan")),
                norm=float(p.get("norm", "nan")),
                head=tuple(float(v) for v in p.get("head", ())),
            )
    return topo


def _fast_json(lines: int) -> Callable[[bytes], Any] | None:
    """orjson's ``loads`` for a decode call of ``lines`` index lines (:data:`ORJSON_LINES`),
    or None: a small call before orjson was imported, or no orjson (``engine/orjson_lazy.py``;
    ``json`` then decodes every line, as before)."""
    lib = orjson_lazy.module(lines >= ORJSON_LINES)
    return None if lib is None else lib.loads


def _at_byte(offset: int) -> Callable[[int], str]:
    """Where a line starts, for a note about it (one line)."""
    return lambda _: f"at byte {offset}"


def _at_bytes(offsets: Sequence[int]) -> Callable[[int], str]:
    """Where each of a batch of lines starts, by its position in the batch."""
    return lambda i: f"at byte {offsets[i]}"
