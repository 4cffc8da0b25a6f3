"""A finished layerwatch index as numpy columns, scanned without parsing every line as JSON.

Opening a big dump used to mean one ``json.loads`` and one :class:`TensorRecord` per tensor
line (~9 µs each: 90 s for 10 M tensors). Pairing and windowing need only each line's token,
node and stem; everything else (dtype, shape, file, offsets, statistics) is needed only for the
tensors being compared. So a tensor line is read by its fixed head, which both writers of the
format emit (``capture/index_lines.py`` and ``capture/format.py`` ``IndexTensor.to_json``):

    {"k":"t","token":T,"node":"N","stem":"S",...

vectorised over a block of lines with numpy: token digits from a fixed-width gather, node and
stem as the byte ranges up to the next quote, interned into one string table by a 64-bit hash
of the padded bytes (every row is checked against its hash's first row, so a collision is
caught, never trusted). The columns keep each line's byte offset and length: a record is built
from its line (``LayerwatchReader.records``) only when its window is compared.

Every other line (token ids, weights, cases, drops, end, errors) and any tensor line whose head
does not match (an escaped name, another key order, a corrupt line) goes the JSON way, in index
order, so bad input keeps the reader's notes.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # imported where scanned: concurrent.futures brings logging (~3 ms), which
    # an msit or ATB compare (this module imported only to detect the format) never needs
    from concurrent.futures import Future

HEAD = b'{"k":"t","token":'
NODE = b',"node":"'
STEM = b'","stem":"'
BLOCK_BYTES = 2 << 20
"""Index bytes scanned a time (whole lines): a block's arrays stay in cache, and freed blocks
leave little behind (16 MB blocks cost ~1.7× the CPU and ~60 MB more RSS after opening 1 M)."""
THREADS = max(1, min(4, os.cpu_count() or 1))
"""Blocks scanned at once."""
TOKEN_DIGITS = 12
_PAD = 64
"""Zero bytes after a block, so fixed-width gathers near its end stay in bounds."""


@dataclass
class NameTable:
    """Node and stem names, one id each (shared by every rank's columns)."""

    names: list[str] = field(default_factory=list)
    ids: dict[str, int] = field(default_factory=dict)
    known: tuple[np.ndarray, np.ndarray, np.ndarray] = field(
        default_factory=lambda: (
            np.zeros(0, np.uint64),
            np.zeros(0, np.uint64),
            np.zeros((0, 2), np.int32),
        )
    )
    """(first hash sorted, second hash, (node id, stem id)) of every ``node","stem":"stem``
    span decoded so far: the same pairs come back at every token, so each is decoded once
    and later blocks find theirs with one ``searchsorted``."""

    def id(self, name: str) -> int:
        found = self.ids.get(name)
        if found is None:
            found = self.ids[name] = len(self.names)
            self.names.append(name)
        return found


@dataclass
class IndexColumns:
    """One rank's tensor lines in index order: token, node and stem ids, and where the line is.

    24 bytes a tensor; ``extra`` holds the other lines (byte offset, the line) for the JSON way.
    """

    token: np.ndarray
    node: np.ndarray
    stem: np.ndarray
    offset: np.ndarray
    """Byte offset of the line in ``index.jsonl``."""
    length: np.ndarray
    """Bytes of the line without its newline."""
    extra: list[tuple[int, bytes]]
    size: int
    """Bytes scanned (whole lines); a cut-short last line after them is ``torn``."""
    torn: bool = False
    spans: TokenSpans | None = None
    """Set by ``scan_file(per_token=True)``: the index kept per token, with no row a tensor."""
    lines: int = -1
    """Tensor lines scanned, of every node (-1: ``len`` of the rows)."""

    def __len__(self) -> int:
        return len(self.token) if self.spans is None else int(self.spans.count.sum())

    @property
    def scanned(self) -> int:
        """Tensor lines in the index, before any ``--nodes`` filter."""
        return len(self.token) if self.lines < 0 else self.lines

    def rows_in_token_order(self) -> np.ndarray | None:
        """Row numbers sorted by token, index order within a token (stable); None when the
        index is in token order already (a finished dump's usual case: no array needed)."""
        if len(self.token) < 2 or bool(np.all(self.token[1:] >= self.token[:-1])):
            return None
        return np.argsort(self.token, kind="stable")

    def token_spans(self) -> TokenSpans | None:
        """Per token, the byte range of its lines, when the index is in token order (else
        None): all a windowed compare needs to keep of an index it reads whole tokens of."""
        fold = _SpanFold(None)
        fold.add((self.token, self.node, self.stem, self.offset, self.length))
        return fold.spans(None) if fold.ordered else None

    def keep_nodes(self, pattern: str, table: NameTable) -> IndexColumns:
        """``--nodes GLOB`` on the columns: rows of other nodes are never built."""
        return self.keep_rows(NodeMatch(pattern, table)(self.node))

    def keep_rows(self, keep: np.ndarray) -> IndexColumns:
        """These rows only (a mask or row numbers)."""
        return IndexColumns(
            self.token[keep],
            self.node[keep],
            self.stem[keep],
            self.offset[keep],
            self.length[keep],
            self.extra,
            self.size,
            self.torn,
            lines=self.scanned,
        )


@dataclass
class TokenSpans:
    """An index in token order kept per token, not per tensor: each token's tensor lines lie
    in ``[begin, end)`` of the file (with the token's other lines between them)."""

    token: np.ndarray
    begin: np.ndarray
    end: np.ndarray
    count: np.ndarray
    """Tensor lines of the token."""
    nodes: str | None = None
    """The ``--nodes`` glob the spans were folded under: only matching lines counted and
    spanned, and a window's lines are scanned again to keep only theirs (``lines_in``)."""


class NodeMatch:
    """``--nodes GLOB`` over a growing :class:`NameTable`: a name id's match, computed once."""

    def __init__(self, pattern: str, table: NameTable) -> None:
        self.pattern = pattern
        self.table = table
        self._known = np.zeros(0, bool)

    def __call__(self, node: np.ndarray) -> np.ndarray:
        names = self.table.names
        if len(self._known) < len(names):
            more = [fnmatchcase(n, self.pattern) for n in names[len(self._known) :]]
            self._known = np.concatenate([self._known, np.array(more, bool)])
        return self._known[node] if len(node) else np.zeros(0, bool)


class _SpanFold:
    """An index folded block by block into :class:`TokenSpans` (rows in offset order): per
    token its first line's offset, its last line's end and its line count; ``ordered`` turns
    False at the first token lower than one before it (the rows are gone: scan again)."""

    def __init__(self, match: NodeMatch | None) -> None:
        self.match = match
        self.parts: list[tuple[np.ndarray, ...]] = []
        self.last = -1
        self.lines = 0
        self.ordered = True

    def add(self, cols: tuple[np.ndarray, ...]) -> bool:
        token, node, _, offset, length = cols
        self.lines += len(token)
        if len(offset) > 1 and not bool(np.all(offset[1:] > offset[:-1])):
            order = np.argsort(offset, kind="stable")  # JSON fall-back rows, put in place
            token, node, offset, length = token[order], node[order], offset[order], length[order]
        if self.match is not None:
            keep = self.match(node)
            token, offset, length = token[keep], offset[keep], length[keep]
        if not len(token):
            return True
        if int(token[0]) < self.last or bool(np.any(token[1:] < token[:-1])):
            self.ordered = False
            return False
        cut = np.flatnonzero(token[1:] != token[:-1]) + 1
        first = np.concatenate([[0], cut])
        last = np.concatenate([cut, [len(token)]]) - 1
        self.parts.append(
            (token[first].astype(np.int64), offset[first].astype(np.int64),
             (offset[last] + length[last]).astype(np.int64), (last - first + 1).astype(np.int64))
        )  # fmt: skip
        self.last = int(token[-1])
        return True

    def spans(self, nodes: str | None) -> TokenSpans:
        """The folded spans, a token's runs from consecutive blocks joined."""
        if not self.parts:
            empty = np.zeros(0, np.int64)
            return TokenSpans(empty, empty, empty, empty, nodes)
        token, begin, end, count = (np.concatenate(c) for c in zip(*self.parts, strict=True))
        new = np.ones(len(token), bool)
        new[1:] = token[1:] != token[:-1]
        starts = np.flatnonzero(new)
        stops = np.concatenate([starts[1:], [len(token)]]) - 1
        return TokenSpans(
            token[starts], begin[starts], end[stops], np.add.reduceat(count, starts), nodes
        )


def tensor_lines(data: bytes, base: int) -> tuple[list[bytes], list[int]]:
    """The lines of ``data`` (at byte ``base`` of the index) that may be tensor lines, and
    their offsets: what a token span holds besides token ids and other kinds."""
    lines: list[bytes] = []
    offsets: list[int] = []
    at = base
    for line in data.split(b"\n"):
        if line.startswith(b'{"k":"t"') or (b'"k":"t"' in line and b'"k":"token"' not in line):
            lines.append(line)
            offsets.append(at)
        at += len(line) + 1
    return lines, offsets


def scan_file(
    path: str | os.PathLike[str],
    table: NameTable,
    threads: int | None = None,
    *,
    per_token: bool = False,
    nodes: str | None = None,
) -> IndexColumns:
    """Scan a whole index file (``OSError`` when it cannot be read). Blocks are scanned by
    ``threads`` workers (numpy releases the GIL); names are given ids in index order.

    ``per_token``: each block is folded into per-token byte ranges and counts as it is scanned
    (``spans``; of the lines of nodes matching ``nodes`` only) and no row a tensor is kept, so
    opening costs O(tokens), not 24 B a tensor line; an index out of token order (its rows
    needed to sort it) is scanned again as rows, ``nodes`` applied to them."""
    fold = _SpanFold(NodeMatch(nodes, table) if nodes else None) if per_token else None
    cols = _scan(path, table, threads or THREADS, fold)
    if fold is None:
        return cols
    if fold.ordered:
        cols.spans = fold.spans(nodes)
        cols.lines = fold.lines
        return cols
    cols = _scan(path, table, threads or THREADS, None)
    return cols.keep_nodes(nodes, table) if nodes else cols


def _scan(
    path: str | os.PathLike[str], table: NameTable, threads: int, fold: _SpanFold | None
) -> IndexColumns:
    """``scan_file``'s pass: rows kept, or folded into ``fold`` (stopped early when it finds
    the index out of token order)."""
    from concurrent.futures import ThreadPoolExecutor

    parts: list[tuple[np.ndarray, ...]] = []
    extra: list[tuple[int, bytes]] = []
    size = 0
    carry = np.zeros(0, np.uint8)  # a line not yet complete
    pending: deque[tuple[int, Future[_Scanned]]] = deque()
    with open(path, "rb", buffering=0) as fh, ThreadPoolExecutor(threads) as pool:
        while True:
            block = np.empty(len(carry) + BLOCK_BYTES + _PAD, np.uint8)
            block[: len(carry)] = carry
            got = fh.readinto(block.data[len(carry) : len(carry) + BLOCK_BYTES])
            if not got:
                break
            filled = len(carry) + got
            cut = _after_last_newline(block, len(carry), filled)
            carry = block[cut:filled].copy()  # one line longer than a block: read on
            if cut:
                pending.append((size, pool.submit(_scan_vectors, block, cut)))
                size += cut
            while len(pending) > threads:
                base, job = pending.popleft()
                _keep(_name_rows(job.result(), base, table, extra), parts, fold)
            if fold is not None and not fold.ordered:
                break
        while pending:
            base, job = pending.popleft()
            _keep(_name_rows(job.result(), base, table, extra), parts, fold)
    torn = bool(bytes(carry).strip())
    if not parts:
        empty = np.zeros(0, np.int64)
        return IndexColumns(empty, empty.astype(np.int32), empty.astype(np.int32), empty,
                            empty.astype(np.int32), extra, size, torn)  # fmt: skip
    cols = [np.concatenate(c) for c in zip(*parts, strict=True)]
    token, node, stem, offset, length = cols
    if len(offset) > 1 and not bool(np.all(offset[1:] > offset[:-1])):
        order = np.argsort(offset, kind="stable")  # rows from JSON fall-backs, put in place
        token, node, stem, offset, length = (c[order] for c in cols)
    if len(token) and int(token.min()) >= 0 and int(token.max()) < 2**31:
        token = token.astype(np.int32)  # 4 bytes a tensor less, for the whole compare
    return IndexColumns(token, node, stem, offset, length, extra, size, torn)


def _keep(cols: tuple[np.ndarray, ...], parts: list[tuple[np.ndarray, ...]],
          fold: _SpanFold | None) -> None:  # fmt: skip
    """A block's rows kept, or folded (not once the fold found the index out of order)."""
    if fold is None:
        parts.append(cols)
    elif fold.ordered:
        fold.add(cols)


def lines_in(data: bytes, base: int, table: NameTable, match: NodeMatch, low: int,
             high: int) -> tuple[list[bytes], list[int]]:  # fmt: skip
    """The tensor lines of tokens ``low..high`` of nodes ``match`` takes in ``data`` (whole
    lines at byte ``base`` of the index) and their offsets, in index order: the rows a
    ``--nodes`` column table keeps (``keep_nodes``), found by scanning a window's bytes again."""
    block = np.zeros(len(data) + 1 + _PAD, np.uint8)
    block[: len(data)] = np.frombuffer(data, np.uint8)
    block[len(data)] = 10
    token, node, _, offset, length = _name_rows(
        _scan_vectors(block, len(data) + 1), base, table, []
    )
    keep = match(node) & (token >= low) & (token <= high)
    offset, length = offset[keep], length[keep]
    order = np.argsort(offset, kind="stable")
    at = offset[order].tolist()
    return [
        data[o - base : o - base + n] for o, n in zip(at, length[order].tolist(), strict=True)
    ], at


def _after_last_newline(buf: np.ndarray, low: int, high: int) -> int:
    """One past the last newline in ``buf[low:high]`` (0 when none), looking from the end."""
    step = 1 << 16
    while high > low:
        start = max(low, high - step)
        found = np.flatnonzero(buf[start:high] == 10)
        if len(found):
            return start + int(found[-1]) + 1
        high = start
    return 0


@dataclass
class _Scanned:
    """One block's vector work, before its names get ids (``_name_rows``, in order)."""

    block: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    ok: np.ndarray
    token: np.ndarray
    node_s: np.ndarray
    node_len: np.ndarray
    stem_e: np.ndarray
    first: np.ndarray
    """Per distinct (node, stem): a row that has it."""
    inverse: np.ndarray
    """Per tensor row: its distinct pair."""
    hashes: tuple[np.ndarray, np.ndarray] | None
    """Per distinct pair: its two hashes (None after a collision)."""


def _scan_vectors(a: np.ndarray, cut: int) -> _Scanned:
    """The whole lines ``a[:cut]`` (``a`` has ``_PAD`` bytes after ``cut``): which are tensor
    lines with the fixed head, their tokens, where node and stem are, and which rows share a
    (node, stem)."""
    raw = a[:cut]
    w = np.ndarray((len(a) - 7,), dtype="<u8", buffer=a, strides=(1,))  # 8 bytes at any offset
    ends = np.flatnonzero(raw == 10)
    starts = np.empty(len(ends), np.int64)
    starts[:1] = 0
    starts[1:] = ends[:-1] + 1
    ok = (ends - starts > len(HEAD) + 16) & _matches(w, starts, HEAD)
    at = starts + len(HEAD)
    token, nd = _digits(a, at)
    ok &= nd > 0
    at = at + nd
    ok &= _matches(w, at, NODE)
    node_s = at + len(NODE)
    # node and stem end at the next quote (no escapes: lines with a backslash go the JSON way)
    node_e = _next_quote(w, node_s, ends, ok)
    ok &= node_e < ends
    ok &= _matches(w, node_e, STEM)
    stem_e = _next_quote(w, node_e + len(STEM), ends, ok)
    ok &= (stem_e < ends) & (a[stem_e + 1] == 44)  # '",' after the stem
    if (raw == 92).any():  # a backslash: escapes are JSON's business
        ok[np.unique(np.searchsorted(ends, np.flatnonzero(raw == 92)))] = False
    rows = np.flatnonzero(ok)
    node_s, node_e, stem_e = node_s[rows], node_e[rows], stem_e[rows]
    first, inverse, hashes = _distinct(a, w, node_s, stem_e, node_e - node_s)
    return _Scanned(a, starts, ends, ok, token[rows], node_s, node_e - node_s, stem_e, first,
                    inverse, hashes)  # fmt: skip


def _name_rows(
    got: _Scanned, base: int, table: NameTable, extra: list[tuple[int, bytes]]
) -> tuple[np.ndarray, ...]:
    """Columns (token, node, stem, offset, length) of one scanned block at byte ``base``;
    its other lines are appended to ``extra``."""
    a = got.block
    ids = np.zeros((len(got.first), 2), np.int32)
    todo = np.arange(len(got.first))
    if got.hashes is not None and len(table.known[0]):
        k1, k2, kids = table.known
        h1, h2 = got.hashes
        at = np.minimum(np.searchsorted(k1, h1), len(k1) - 1)
        hit = (k1[at] == h1) & (k2[at] == h2)
        ids[hit] = kids[at[hit]]
        todo = np.flatnonzero(~hit)
    new: list[int] = []
    for i in todo.tolist():  # pairs not seen before: decode their bytes
        row = int(got.first[i])
        s, n, e = int(got.node_s[row]), int(got.node_len[row]), int(got.stem_e[row])
        text = a[s:e].tobytes()
        ids[i, 0] = table.id(text[:n].decode("utf-8", "surrogateescape"))
        ids[i, 1] = table.id(text[n + len(STEM) :].decode("utf-8", "surrogateescape"))
        new.append(i)
    if new and got.hashes is not None:
        k1 = np.concatenate([table.known[0], got.hashes[0][new]])
        k2 = np.concatenate([table.known[1], got.hashes[1][new]])
        kids = np.concatenate([table.known[2], ids[new]])
        order = np.argsort(k1, kind="stable")
        table.known = (k1[order], k2[order], kids[order])
    nodes, stems = ids[:, 0], ids[:, 1]
    rows = np.flatnonzero(got.ok)
    cols = [
        got.token,
        nodes[got.inverse],
        stems[got.inverse],
        got.starts[rows] + base,
        (got.ends - got.starts)[rows],
    ]
    fallback = np.flatnonzero(~got.ok)
    if len(fallback):
        more = _json_way(a, got.starts, got.ends, fallback, base, table, extra)
        if more is not None:
            cols = [np.concatenate([c, m]) for c, m in zip(cols, more, strict=True)]
    token, node, stem, offset, length = cols
    return (
        token.astype(np.int64),
        node.astype(np.int32),
        stem.astype(np.int32),
        offset.astype(np.int64),
        length.astype(np.int32),
    )


def _digits(a: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The unsigned integer at each ``at`` and its number of digits (0: none), a digit
    column at a time while any row still has one."""
    value = np.zeros(len(at), np.int64)
    count = np.zeros(len(at), np.int64)
    going = np.ones(len(at), bool)
    for j in range(TOKEN_DIGITS):
        d = a[at + j].astype(np.int64) - 48
        going &= (d >= 0) & (d <= 9)
        if not going.any():
            break
        value = np.where(going, value * 10 + d, value)
        count += going
    return value, count


_MASKS = np.array([(1 << (8 * n)) - 1 for n in range(8)] + [(1 << 64) - 1], np.uint64)
"""The low ``n`` bytes of a little-endian word."""


def _matches(w: np.ndarray, at: np.ndarray, want: bytes) -> np.ndarray:
    """Whether the bytes at each ``at`` are ``want`` (one 8-byte gather a word of it)."""
    ok = np.ones(len(at), bool)
    for k in range(0, len(want), 8):
        part = want[k : k + 8]
        lit = np.uint64(int.from_bytes(part, "little"))
        word = w[at + k]
        if len(part) < 8:
            word = word & _MASKS[len(part)]
        ok &= word == lit
    return ok


_ONES = np.uint64(0x0101010101010101)
_HIGHS = np.uint64(0x8080808080808080)
_QUOTES = np.uint64(0x2222222222222222)


def _next_quote(w: np.ndarray, at: np.ndarray, ends: np.ndarray, rows: np.ndarray) -> np.ndarray:
    (
        """Position of the first ``"`` at or after ``at`` in each of ``rows`` (a mask), 8 bytes a
    step (a zero byte of ``word ^ '"""
        """""'``, found with the carry trick); ``ends`` for rows
    with none before their line's end."""
    )
    out = ends.copy()
    active = np.flatnonzero(rows)
    start = at[active]
    k = 0
    while len(active):
        y = w[start + k] ^ _QUOTES
        t = (y - _ONES) & ~y & _HIGHS  # the lowest set bit marks the first quote byte
        hit = t != 0
        if hit.any():
            low = t[hit] & (~t[hit] + np.uint64(1))
            byte = (np.log2(low.astype(np.float64)).astype(np.int64) - 7) >> 3
            out[active[hit]] = start[hit] + k + byte
            miss = ~hit
            active, start = active[miss], start[miss]
        k += 8
        past = start + k < ends[active]
        if not past.all():
            active, start = active[past], start[past]
    return out


_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F))


def _distinct(
    a: np.ndarray, w: np.ndarray, start: np.ndarray, end: np.ndarray, node_len: np.ndarray
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
    """(first, inverse) of the rows' ``node","stem":"stem`` bytes ``a[start:end]``, like
    ``np.unique``'s: a 128-bit hash a row (two 64-bit ones over its words, read backwards from
    the end so a short first word overlaps only the constant ``"node":"`` before it). Rows
    that share the first hash but not the second would be a collision: then the bytes
    themselves are sorted instead."""
    if not len(start):
        return np.zeros(0, np.int64), np.zeros(0, np.int64), None
    span = end - start
    words = (span + 7) >> 3
    h1 = span.astype(np.uint64) * _MIX[0] + node_len.astype(np.uint64)
    h2 = h1 ^ _MIX[1]
    for k in range(int(words.max())):
        word = w[np.maximum(end - 8 * (k + 1), 0)]
        if k >= int(words.min()):
            word = np.where(k < words, word, np.uint64(0))
        h1 = (h1 ^ word) * _MIX[0]
        h1 ^= h1 >> np.uint64(29)
        h2 = (h2 + word) * _MIX[1]
    _, first, inverse = np.unique(h1, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    if bool((h2 == h2[first][inverse]).all()):
        return first, inverse, (h1[first], h2[first])
    width = int(span.max())
    grid = a[start[:, None] + np.arange(width)]
    grid[np.arange(width) >= span[:, None]] = 0
    keys = np.ascontiguousarray(grid).view(np.dtype((np.void, width))).ravel()
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1), None


def _json_way(
    a: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    rows: np.ndarray,
    base: int,
    table: NameTable,
    extra: list[tuple[int, bytes]],
) -> tuple[np.ndarray, ...] | None:
    """Lines the fast head did not read: a tensor line whose JSON has token, node and stem is
    still a row; the rest (other kinds, corrupt lines) go to ``extra`` in order."""
    found: list[tuple[int, int, int, int, int]] = []
    for i in rows.tolist():
        s, e = int(starts[i]), int(ends[i])
        line = bytes(a[s:e])
        if not line.strip():
            continue
        if line.startswith(b'{"k":"t"') or b'"k":"t"' in line:
            try:
                obj = json.loads(line)
                if obj.get("k") == "t":
                    node, stem = obj["node"], obj["stem"]
                    token = obj["token"]
                    if isinstance(token, int) and isinstance(node, str) and isinstance(stem, str):
                        found.append((token, table.id(node), table.id(stem), s + base, e - s))
                        continue
            except (ValueError, AttributeError, KeyError):
                pass
        extra.append((s + base, line))
    if not found:
        return None
    return tuple(np.array(c, np.int64) for c in zip(*found, strict=True))


def iter_lines(path: str | os.PathLike[str], offsets: np.ndarray, lengths: np.ndarray,
               *, span_limit: int = 8 << 20) -> Iterator[bytes]:  # fmt: skip
    """The lines at ``offsets`` (ascending or not), read with a few ``pread`` calls: runs of
    nearby lines are read as one span (at most ``span_limit`` bytes)."""
    if not len(offsets):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        i, n = 0, len(offsets)
        off = offsets.tolist()
        ln = lengths.tolist()
        while i < n:
            lo = off[i]
            hi = lo + ln[i]
            j = i + 1
            while j < n and lo <= off[j] and off[j] + ln[j] - lo <= span_limit:
                hi = max(hi, off[j] + ln[j])
                j += 1
            data = os.pread(fd, hi - lo, lo)
            for k in range(i, j):
                yield data[off[k] - lo : off[k] - lo + ln[k]]
            i = j
    finally:
        os.close(fd)
