"""Which token each msprobe call belongs to, decided entry by entry (engine/readers/msprobe.py).

msprobe has no token axis: its entries are in completion order, and the top-level module that
finishes last in a forward (the one just before a top-level module repeats, e.g. ``lm_head``)
closes a token. Top-level APIs right after a token closes (generate's argmax, stopping checks)
stay with that token; the next entry inside a module opens the next. An entry's token depends
only on the entries before it once the closing module is known, so :class:`TokenSplitter` holds
entries only until the first top-level module repeats (about one token), then hands each on as
it comes: the same tokens whether a file is read whole or as a stream.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections import deque
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

from layerwatch.engine.readers.json_stream import JsonStreamError, ObjectStream

_MODULE = re.compile(r"^Module\.(?:(.+)\.)?([^.]+)\.forward\.(\d+)$")

T = TypeVar("T")


def module_parts(name: str) -> tuple[str, str] | None:
    """``Module.model.layers.0.mlp.LlamaMLP.forward.3`` → (``model.layers.0.mlp``, ``LlamaMLP``)."""
    match = _MODULE.match(name)
    if match is None:
        return None
    return match.group(1) or "", match.group(2)


def top_paths(paths: set[str]) -> set[str]:
    """The module paths no other path nests in (``model`` over ``model.layers.0``): top-level
    when the dump has no construct.json to say which modules have no parent."""
    out = set()
    for path in paths:
        parts = path.split(".")
        if not any(".".join(parts[:k]) in paths for k in range(1, len(parts))):
            out.add(path)
    return out


class TokenSplitter(Generic[T]):
    """Tokens of entries pushed in file order: :meth:`push` and :meth:`finish` return the
    (token, item) pairs decided so far, in order (tokens never decrease).

    ``tops``: without construct.json, the top-level module paths of the whole file
    (:func:`top_paths`); with it, None: a module is top-level when its parent is None."""

    def __init__(self, tops: set[str] | None = None) -> None:
        self._tops = tops
        self._held: list[tuple[T, str | None, bool]] = []
        self._seen: set[str] = set()
        self._last_top: str | None = None
        self._closing: str | None = None
        self._t = 0
        self._gap = False
        self.bounds = 0
        """Closing entries so far: the number of tokens."""
        self.entries = 0
        self.modules = 0
        """Module entries seen (none: an L1 dump, every call in token 0)."""
        self.repeat = False
        """The closing module was found by a repeat (else only guessed at :meth:`finish`)."""
        self.last_top = -1
        """Index of the last top-level module entry (what a dump still being written settles)."""

    @property
    def tokens(self) -> int:
        return max(self.bounds, 1 if self.entries else 0)

    def push(self, item: T, name: str, parent: Any) -> list[tuple[int, T]]:
        """One entry (``parent``: its construct.json parent, None without one)."""
        parts = module_parts(name)
        top: str | None = None
        if parts is not None:
            self.modules += 1
            path = parts[0]
            is_top = parent is None if self._tops is None else path in self._tops
            if is_top:
                top = path
                self.last_top = self.entries
        top_api = parts is None and parent is None
        self.entries += 1
        if self._closing is not None:
            return [self._token(item, top, top_api)]
        self._held.append((item, top, top_api))
        if top is None:
            return []
        if top not in self._seen:
            self._seen.add(top)
            self._last_top = top
            return []
        self.repeat = True
        self._closing = self._last_top
        return self._release()

    def finish(self) -> list[tuple[int, T]]:
        """What is still held, at the end of the file."""
        if self._closing is None:
            self._closing = self._last_top
        return self._release()

    def _release(self) -> list[tuple[int, T]]:
        held, self._held = self._held, []
        return [self._token(item, top, top_api) for item, top, top_api in held]

    def _token(self, item: T, top: str | None, top_api: bool) -> tuple[int, T]:
        if self._gap and not top_api:
            self._gap = False
        token = self._t - 1 if self._gap else self._t
        if top is not None and top == self._closing:
            self._t += 1
            self._gap = True
            self.bounds += 1
        return token, item


def assign_tokens(entries: list[tuple[str, dict]], construct: dict) -> tuple[list[int], int, int]:
    """Token per entry, the number of tokens, and how many leading entries have a final token
    (a file still being written: the rest may change once more of it lands)."""
    tops = None
    if not construct:
        tops = top_paths({p[0] for name, _ in entries if (p := module_parts(name)) is not None})
    splitter: TokenSplitter[int] = TokenSplitter(tops)
    tokens: list[int] = []
    for i, (name, _) in enumerate(entries):
        tokens.extend(t for t, _ in splitter.push(i, name, construct.get(name)))
    tokens.extend(t for t, _ in splitter.finish())
    settled = len(entries) if splitter.repeat else splitter.last_top + 1
    return tokens, splitter.tokens, settled


PARENTS_FROM_NAMES = "module parents are taken from dump.json's names"
"""How a dump whose construct.json gives no parent is read (:func:`unused_note`)."""


def unused_note(path: Path, *, whole: bool = False) -> str | None:
    """The note for a ``construct.json`` that is there but gives no parent: empty, cut short
    before its first call, not a JSON object, or corrupt (``whole``: anywhere in the file, as
    when it is read whole; else at its start, as a stream finds it). The dump is then read as if
    it had none. None: it gives parents, is an empty object, or is missing."""
    try:
        stream = ObjectStream(path, cut_ok=True)
    except OSError:
        return None
    with contextlib.closing(stream):
        try:
            for _ in stream.walk():
                if not whole:
                    return None
        except JsonStreamError as exc:
            return f"{exc}; {PARENTS_FROM_NAMES}"
        if stream.cut is None:
            return None
        if stream.cut == 0:
            return f"{path}: empty; {PARENTS_FROM_NAMES}"
        return f"{path}: ends at character {stream.cut} before its first call; {PARENTS_FROM_NAMES}"


class Parents:
    """construct.json's parent of each call, read only as far as the calls asked for so far:
    msprobe writes it in about the order of dump.json, so what waits is about a token's worth
    (a call it lacks reads it to the end once). Each name is asked for once (:meth:`pop`)."""

    def __init__(self, path: Path) -> None:
        self._ahead: dict[str, Any] = {}
        self._names: dict[str, str] = {}
        self._stream: ObjectStream | None = None
        self._entries: Iterator[tuple[str | None, str, Any]] | None = None
        with contextlib.suppress(OSError):
            self._stream = ObjectStream(path, cut_ok=True)
            self._entries = self._stream.walk()
        try:
            self.present = self._read_one()
            """construct.json has an entry (an empty, missing or unusable one: no parents
            known; corrupt after its first entry raises where it is found)."""
        except JsonStreamError:
            self._entries = None
            self.present = False
        self.unused = None if self.present else unused_note(path)
        """:func:`unused_note` when no parent is known though the file is there."""

    @property
    def cut(self) -> int | None:
        """Where construct.json ends early, once read to there (None: whole so far)."""
        return None if self._stream is None else self._stream.cut

    def _read_one(self) -> bool:
        if self._entries is None:
            return False
        try:
            _, key, value = next(self._entries)
        except StopIteration:
            self._entries = None
            return False
        if isinstance(value, str):  # every child of a module names it: one string each
            value = self._names.setdefault(value, sys.intern(value))
        self._ahead[key] = value
        return True

    def pop(self, name: str, missing: Any = None) -> Any:
        """The parent of ``name`` (None: a top-level call; ``missing``: construct.json lacks
        it)."""
        while name not in self._ahead:
            if not self._read_one():
                return missing
        return self._ahead.pop(name)


_MISSING = object()
"""A call construct.json does not have (:meth:`Parents.pop`)."""

Call = tuple[str, dict, Any]
"""(entry name, entry, its construct.json parent)."""


class RankCalls:
    """One rank's ``dump.json`` as tokens of calls, read as a stream (``compare``'s windows):
    what is held is the splitter's first token, the construct.json entries read ahead and one
    buffer. A file cut short ends at its last complete call (:attr:`cut` says where); corrupt
    JSON raises :class:`~.json_stream.JsonStreamError` where found."""

    def __init__(self, rank_dir: Path, dump: str, construct: str) -> None:
        self.path = rank_dir / dump
        self.head: dict[str, Any] = {}
        """The outer keys before ``data`` (``dump_data_dir``...)."""
        self._parents = Parents(rank_dir / construct)
        tops = None
        if not self._parents.present:  # which modules are top-level needs every module first
            paths = set()
            for where, name, value in ObjectStream(self.path, cut_ok=True).walk("data"):
                parts = module_parts(name) if where is not None else None
                if parts is not None and isinstance(value, dict):
                    paths.add(parts[0])
            tops = top_paths(paths)
        self.splitter: TokenSplitter[tuple[Call, int]] = TokenSplitter(tops)
        self._stream = ObjectStream(self.path, cut_ok=True)
        self._entries: Generator[tuple[str | None, str, Any]] = self._stream.walk("data")
        self._ready: deque[tuple[int, tuple[Call, int]]] = deque()
        self.done = False
        self.construct_cut: tuple[int, int] | None = None
        """(where construct.json ends, the calls read before the first call it lacks): the
        rest of dump.json is not read."""

    def next_token(self) -> tuple[int, list[tuple[Call, int]]] | None:
        """(token in the step, its calls each with the character position after it), or None
        after the last. A call handed out is no longer held here."""
        ready = self._ready
        while not self.done and (not ready or ready[-1][0] == ready[0][0]):
            self._read()
        if not ready:
            return None
        token = ready[0][0]
        out = []
        while ready and ready[0][0] == token:
            out.append(ready.popleft()[1])
        return token, out

    def peek(self) -> int | None:
        """The token :meth:`next_token` gives next (None: none left)."""
        while not self.done and not self._ready:
            self._read()
        return self._ready[0][0] if self._ready else None

    def _read(self) -> None:
        """One more entry into the splitter (its end: what the splitter still holds)."""
        for where, name, value in self._entries:
            if where is None:
                if name == "data":
                    raise JsonStreamError(f'{self.path}: "data" is not an object')
                self.head.setdefault(name, value)
                continue
            if not isinstance(value, dict):
                continue
            parent = self._parents.pop(name, _MISSING)
            if parent is _MISSING:
                if self._parents.present and self._parents.cut is not None:
                    # construct.json was cut before this call: its place in the tree (its
                    # token, an API's name) is unknown from here on, as when dump.json ends
                    self.construct_cut = (self._parents.cut, self.splitter.entries)
                    self._entries.close()  # the file closed now, not when collected
                    break
                parent = None
            call = (name, value, parent)
            self._ready.extend(self.splitter.push((call, self._stream.position), name, call[2]))
            return
        self.done = True
        self._ready.extend(self.splitter.finish())

    @property
    def parents_note(self) -> str | None:
        """Why construct.json gave no parent though it is there (:func:`unused_note`)."""
        return self._parents.unused

    @property
    def cut(self) -> int | None:
        """Where the file ends early (characters), once read to there; None: whole so far."""
        return self._stream.cut

    @property
    def has_data(self) -> bool:
        """A ``data`` object was read (a file without one is skipped, as when read whole)."""
        return self._stream.nested_seen

    def late_head(self, key: str) -> Any:
        """An outer key written after ``data`` (read to the end once more for it)."""
        if key not in self.head and (not self.done or self.construct_cut is not None):
            for where, name, value in ObjectStream(self.path, cut_ok=True).walk("data"):
                if where is None and name != "data":
                    self.head.setdefault(name, value)
        return self.head.get(key)
