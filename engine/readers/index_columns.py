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
from collections.abc import Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

import numpy as np

HEAD = b'{"k":"t","token":'
NODE = b',"node":"'
STEM = b'","stem":"'
BLOCK_BYTES = 16 << 20
"""Index bytes scanned a time (whole lines): the gathers of one block stay a few MB."""
TOKEN_DIGITS = 12
_POW10 = 10 ** np.arange(TOKEN_DIGITS, dtype=np.int64)
_PAD = 64
"""Zero bytes after a block, so fixed-width gathers near its end stay in bounds."""


@dataclass
class NameTable:
    """Node and stem names, one id each (shared by every rank's columns)."""

    names: list[str] = field(default_factory=list)
    ids: dict[str, int] = field(default_factory=dict)

    def id(self, name: str) -> int:
        found = self.ids.get(name)
        if found is None:
            found = self.ids[name] = len(self.names)
            self.names.append(name)
        return found


@dataclass
class IndexColumns:
    """One rank's tensor lines in index order: token, node and stem ids, and where the line is.

    ~28 bytes a tensor; ``extra`` holds the other lines (byte offset, the line) for the JSON way.
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

    def __len__(self) -> int:
        return len(self.token)

    def rows_in_token_order(self) -> np.ndarray:
        """Row numbers sorted by token, index order within a token (stable)."""
        if len(self.token) < 2 or bool(np.all(self.token[1:] >= self.token[:-1])):
            return np.arange(len(self.token))
        return np.argsort(self.token, kind="stable")

    def keep_nodes(self, pattern: str, table: NameTable) -> IndexColumns:
        """``--nodes GLOB`` on the columns: rows of other nodes are never built."""
        match = np.array([fnmatchcase(n, pattern) for n in table.names] or [False])
        keep = match[self.node] if len(self.node) else np.zeros(0, bool)
        return IndexColumns(
            self.token[keep],
            self.node[keep],
            self.stem[keep],
            self.offset[keep],
            self.length[keep],
            self.extra,
            self.size,
            self.torn,
        )


def scan_file(path: str | os.PathLike[str], table: NameTable) -> IndexColumns:
    """Scan a whole index file (``OSError`` when it cannot be read)."""
    parts: list[tuple[np.ndarray, ...]] = []
    extra: list[tuple[int, bytes]] = []
    size = 0
    buf = np.zeros(2 * BLOCK_BYTES + _PAD, np.uint8)
    held = 0  # bytes of a line not yet complete, at the start of buf
    with open(path, "rb", buffering=0) as fh:
        while True:
            if held + BLOCK_BYTES > len(buf) - _PAD:  # one line longer than a block
                buf = np.concatenate([buf, np.zeros(len(buf), np.uint8)])
            got = fh.readinto(memoryview(buf)[held : held + BLOCK_BYTES])
            if not got:
                break
            filled = held + got
            last = buf[held:filled]
            cut = held + int(np.flatnonzero(last == 10)[-1]) + 1 if (last == 10).any() else 0
            if cut:
                parts.append(scan_block(buf, cut, size, table, extra))
                size += cut
            held = filled - cut
            buf[:held] = buf[cut:filled].copy()
    torn = bool(bytes(buf[:held]).strip())
    if not parts:
        empty = np.zeros(0, np.int64)
        return IndexColumns(empty, empty.astype(np.int32), empty.astype(np.int32), empty,
                            empty.astype(np.int32), extra, size, torn)  # fmt: skip
    cols = [np.concatenate(c) for c in zip(*parts, strict=True)]
    token, node, stem, offset, length = cols
    if len(offset) > 1 and not bool(np.all(offset[1:] > offset[:-1])):
        order = np.argsort(offset, kind="stable")  # rows from JSON fall-backs, put in place
        token, node, stem, offset, length = (c[order] for c in cols)
    return IndexColumns(token, node, stem, offset, length, extra, size, torn)


def scan_block(
    a: np.ndarray, cut: int, base: int, table: NameTable, extra: list[tuple[int, bytes]]
) -> tuple[np.ndarray, ...]:
    """The whole lines ``a[:cut]`` (at byte ``base`` of the index; ``a`` has at least
    ``_PAD`` bytes after ``cut``) → (token, node, stem, offset, length) of its tensor lines;
    the other lines are appended to ``extra``."""
    raw = a[:cut]
    w = np.ndarray((len(a) - 7,), dtype="<u8", buffer=a, strides=(1,))  # 8 bytes at any offset
    ends = np.flatnonzero(raw == 10)
    starts = np.empty(len(ends), np.int64)
    starts[:1] = 0
    starts[1:] = ends[:-1] + 1
    ok = (ends - starts > len(HEAD) + 16) & _matches(w, starts, HEAD)
    at = starts + len(HEAD)  # token digits
    digits = np.stack([w[at], w[at + 8]], axis=1).view(np.uint8)[:, :TOKEN_DIGITS]
    isdigit = (digits >= 48) & (digits <= 57)
    nd = np.argmin(isdigit, axis=1)  # the first non-digit
    ok &= (nd > 0) & isdigit[:, 0]
    lead = np.clip(nd[:, None] - 1 - np.arange(TOKEN_DIGITS), 0, None)
    value = np.where(np.arange(TOKEN_DIGITS) < nd[:, None], digits.astype(np.int64) - 48, 0)
    token = (value * _POW10[lead]).sum(axis=1)
    at = at + nd
    ok &= _matches(w, at, NODE)
    node_s = at + len(NODE)
    # node and stem end at the next quotes: the 10th and 14th of a tensor line
    quotes = np.flatnonzero(raw == 34)
    first = np.searchsorted(quotes, starts)
    node_e = _quote(quotes, first + 9, cut)
    stem_s = node_e + len(STEM)
    stem_e = _quote(quotes, first + 13, cut)
    ok &= (_quote(quotes, first + 8, cut) == node_s - 1) & (stem_e < ends)
    ok &= _matches(w, node_e, STEM) & (_quote(quotes, first + 12, cut) == stem_s - 1)
    ok &= a[stem_e + 1] == 44  # '",' after the stem
    if (raw == 92).any():  # a backslash: escapes are JSON's business
        ok[np.unique(np.searchsorted(ends, np.flatnonzero(raw == 92)))] = False
    rows = np.flatnonzero(ok)
    node, stem = _intern_pairs(a, w, node_s[rows], stem_e[rows], node_e[rows] - node_s[rows], table)
    token, offset, length = token[rows], starts[rows] + base, (ends - starts)[rows]
    fallback = np.flatnonzero(~ok)
    if len(fallback):
        more = _json_way(a, starts, ends, fallback, base, table, extra)
        if more is not None:
            token = np.concatenate([token, more[0]])
            node = np.concatenate([node, more[1]])
            stem = np.concatenate([stem, more[2]])
            offset = np.concatenate([offset, more[3]])
            length = np.concatenate([length, more[4]])
    return (
        token.astype(np.int64),
        node.astype(np.int32),
        stem.astype(np.int32),
        offset.astype(np.int64),
        length.astype(np.int32),
    )


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


def _quote(quotes: np.ndarray, i: np.ndarray, missing: int) -> np.ndarray:
    """``quotes[i]``, or ``missing`` past the end."""
    return np.where(i < len(quotes), quotes[np.minimum(i, max(len(quotes) - 1, 0))], missing) \
        if len(quotes) else np.full(len(i), missing, np.int64)  # fmt: skip


_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F))


def _intern_pairs(
    a: np.ndarray,
    w: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    node_len: np.ndarray,
    table: NameTable,
) -> tuple[np.ndarray, np.ndarray]:
    """Ids of node and stem for rows whose ``node","stem":"stem`` bytes are ``a[start:end]``:
    a 128-bit hash a row (two 64-bit ones, words masked to the row's length), one dict
    look-up per distinct hash. Rows that share the first hash but not the second would be a
    collision: then the bytes themselves are sorted instead."""
    if not len(start):
        return np.zeros(0, np.int32), np.zeros(0, np.int32)
    span = end - start
    h1 = span.astype(np.uint64) * _MIX[0] + node_len.astype(np.uint64)
    h2 = h1 ^ _MIX[1]
    for k in range(0, int(span.max()), 8):
        word = w[start + k] & _MASKS[np.clip(span - k, 0, 8)]
        h1 = (h1 ^ word) * _MIX[0]
        h1 ^= h1 >> np.uint64(29)
        h2 = (h2 ^ word) * _MIX[1]
        h2 ^= h2 >> np.uint64(31)
    _, first, inverse = np.unique(h1, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    if not bool((h2 == h2[first][inverse]).all()):
        width = int(span.max())
        grid = a[start[:, None] + np.arange(width)]
        grid[np.arange(width) >= span[:, None]] = 0
        keys = np.ascontiguousarray(grid).view(np.dtype((np.void, width))).ravel()
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
    nodes = np.empty(len(first), np.int32)
    stems = np.empty(len(first), np.int32)
    for i, row in enumerate(first.tolist()):
        s, n, e = int(start[row]), int(node_len[row]), int(end[row])
        nodes[i] = table.id(bytes(a[s : s + n]).decode("utf-8", "surrogateescape"))
        stems[i] = table.id(bytes(a[s + n + len(STEM) : e]).decode("utf-8", "surrogateescape"))
    return nodes[inverse], stems[inverse]


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
