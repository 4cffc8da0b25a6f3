"""One top-level JSON object read entry by entry, a buffer at a time.

msprobe writes a step's every call into one ``dump.json`` (``{"task": ..., "data": {call:
{...}, ...}}``) and its parents into ``construct.json``; a long run's files hold hundreds of
megabytes, and ``json.loads`` of them keeps every entry as Python objects (~2 KB a tensor). The
standard library has no streaming parser, so this walks the outer object's punctuation itself
and hands each value to ``json.JSONDecoder.raw_decode`` (the C scanner) over a buffer refilled
from the file: only one entry and one buffer are held. Values are what ``json.loads`` gives.

A file cut short (what a run killed while it wrote its step leaves) is told apart from a corrupt
one: with ``cut_ok`` a walk whose only fault is that the file ends — the text after the failure
point is blank, an unterminated string, or the start of a number or a literal — simply ends
there, every complete entry yielded, and :attr:`ObjectStream.cut` says where. Anything else
(a stray character, garbage followed by more text) is :class:`JsonStreamError` as before.
"""

from __future__ import annotations

import json
import re
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any, TextIO

from layerwatch.capture.errors import LayerwatchError

BLOCK = 1 << 20
"""Characters read a time."""
MAX_VALUE = 64 << 20
"""The longest single value waited for; a value still unparsed past it is corrupt."""
_WS = " \t\n\r"
_KEY = re.compile(r'[ \t\n\r]*"([^"\\\x00-\x1f]*)"[ \t\n\r]*:[ \t\n\r]*')
"""A key without escapes or control characters (what json.loads takes as it is), its colon."""
_AFTER = re.compile(r"[ \t\n\r]*([,}])")
_CUT_TAIL = re.compile(
    r"[ \t\n\r]*|[-+0-9.eE]+|t(?:r(?:u)?)?|f(?:a(?:l(?:s)?)?)?|n(?:u(?:l)?)?|N(?:a)?"
    r"|-?I(?:n(?:f(?:i(?:n(?:i(?:t)?)?)?)?)?)?"
)
"""What may follow the point where decoding failed when the only fault is the file's end: blanks,
a number or a literal (``true``, ``NaN``, ``Infinity``...) cut part-way."""


class JsonStreamError(LayerwatchError):
    """The file is truncated or is not the JSON object it should be (one line, with where)."""


class _Cut(Exception):
    """The file ends early and nothing else is wrong (caught by :meth:`ObjectStream.walk`)."""


class ObjectStream:
    """The entries of the JSON object in ``path``: :meth:`items` yields (key, value) of the
    outer object, except that the value of ``nested`` (an object) is not built: its entries are
    yielded one by one as (``nested``, key, value) triples instead (:meth:`walk`)."""

    def __init__(self, path: Path, block: int | None = None, *, cut_ok: bool = False) -> None:
        self.path = path
        self._cut_ok = cut_ok
        self.cut: int | None = None
        """Where the file ends early (characters), when ``cut_ok`` ended the walk there."""
        # What json.loads of the file's bytes accepts: UTF-8 with or without a byte order mark.
        self._fh: TextIO = open(path, encoding="utf-8-sig", errors="surrogatepass")  # noqa: SIM115
        self._block = block or BLOCK
        self._buf = ""
        self._pos = 0
        self._base = 0
        """Characters dropped from the buffer's front (for positions in messages)."""
        self._eof = False
        self._decode = json.JSONDecoder().raw_decode
        self.nested_seen = False
        """The ``nested`` object was there (even empty)."""

    def close(self) -> None:
        self._fh.close()

    @property
    def position(self) -> int:
        """Characters consumed so far."""
        return self._base + self._pos

    # --- the outer object ---------------------------------------------------------------------
    def walk(self, nested: str | None = None) -> Generator[tuple[str | None, str, Any]]:
        """(None, key, value) for each outer entry, (``nested``, key, value) for each entry of
        the outer ``nested`` object (the object itself never yielded). Raises
        :class:`JsonStreamError` where ``json.loads`` would fail, except a clean cut at the end
        of the file when ``cut_ok``: the walk ends there and :attr:`cut` is set."""
        try:
            self._expect("{")
            for key in self._keys():
                if key == nested and self._peek() == "{":
                    self._pos += 1
                    self.nested_seen = True
                    for inner in self._keys():
                        yield nested, inner, self._value()
                else:
                    yield None, key, self._value()
            if self._peek(eof_ok=True) != "":
                self._fail("extra data after the object")
        except _Cut:
            self.cut = self.position
        finally:
            self.close()

    def _keys(self) -> Iterator[str]:
        """The keys of the object whose ``{`` was just consumed, each with its ``:`` consumed;
        the caller consumes the value before asking for the next key."""
        if self._peek() == "}":
            self._pos += 1
            return
        while True:
            # A plain key, its colon and the blanks after it in one regular-expression match;
            # anything else (escapes, a key cut by the buffer's end) the careful way.
            match = _KEY.match(self._buf, self._pos)
            if match is not None:
                key = match.group(1)
                self._pos = match.end()
            else:
                if self._peek() != '"':
                    self._fail("expected a key")
                key = self._value()
                self._expect(":")
            yield key
            match = _AFTER.match(self._buf, self._pos)
            if match is not None:
                ch = match.group(1)
                self._pos = match.end()
            else:
                ch = self._peek()
                self._pos += 1
            if ch == "}":
                return
            if ch != ",":
                self._fail("expected ',' or '}'")

    # --- the buffer ---------------------------------------------------------------------------
    def _fill(self) -> bool:
        """More characters after the unread ones; False at the end of the file."""
        if self._eof:
            return False
        chunk = self._fh.read(self._block)
        if not chunk:
            self._eof = True
            return False
        self._base += self._pos
        self._buf = self._buf[self._pos :] + chunk
        self._pos = 0
        return True

    def _peek(self, eof_ok: bool = False) -> str:
        """The next non-blank character, not consumed ("" at the end when ``eof_ok``)."""
        while True:
            buf, pos = self._buf, self._pos
            while pos < len(buf) and buf[pos] in _WS:
                pos += 1
            self._pos = pos
            if pos < len(buf):
                return buf[pos]
            if not self._fill():
                if eof_ok:
                    return ""
                self._fail("the file ends early")

    def _expect(self, ch: str) -> None:
        if self._peek() != ch:
            self._fail(f"expected {ch!r}")
        self._pos += 1

    def _value(self) -> Any:
        """The JSON value at the position, decoded whole; the buffer grows until it holds it."""
        if self._pos >= len(self._buf) or self._buf[self._pos] in _WS:
            self._peek()
        while True:
            try:
                value, end = self._decode(self._buf, self._pos)
            except json.JSONDecodeError as exc:
                # A value cut by the buffer's end fails near that end; one failing well before
                # it (or still failing past MAX_VALUE) is corrupt wherever the file ends.
                near_end = exc.pos + 65_536 >= len(self._buf)
                if near_end and len(self._buf) - self._pos < MAX_VALUE and self._fill():
                    continue
                self._fail(exc.msg, self._base + exc.pos, exc.msg)
            if end == len(self._buf) and self._fill():
                continue  # a number at the buffer's end may go on in the next block
            self._pos = end
            return value

    def _fail(self, what: str, at: int | None = None, decoding: str = "") -> None:
        at = self.position if at is None else at
        if self._cut_ok and self._eof and self._only_cut(at - self._base, decoding):
            self._pos = len(self._buf)
            raise _Cut
        raise JsonStreamError(f"{self.path}: truncated or corrupt JSON at character {at}: {what}")

    def _only_cut(self, i: int, decoding: str) -> bool:
        """The text from buffer index ``i`` (where decoding failed) to the end of the file is
        what a cut leaves, not a fault: ``decoding`` is the decoder's message."""
        tail = self._buf[i:]
        if decoding.startswith("Unterminated string"):
            return True  # the scanner met the end before the closing quote
        if decoding.startswith("Invalid \\uXXXX"):
            return re.fullmatch(r"u[0-9a-fA-F]{0,3}", tail) is not None
        return _CUT_TAIL.fullmatch(tail) is not None


def read_cut(
    path: Path, nested: str | None = None
) -> tuple[list[tuple[str | None, str, Any]], int] | None:
    """A file ``json.loads`` refused, read as far as it is whole: (the entries
    :meth:`ObjectStream.walk` yields, where the file ends) when it is cut short and nothing
    else is wrong; None when it is corrupt or cannot be read."""
    try:
        stream = ObjectStream(path, cut_ok=True)
        entries = list(stream.walk(nested))
    except (OSError, JsonStreamError):
        return None
    return None if stream.cut is None else (entries, stream.cut)
