"""Textual's ``Strip`` without its seven caches until one of them is used.

Every ``Strip`` makes seven ``FIFOCache`` objects when it is built (divide, crop, style,
filter, line length, crop-extend, offsets), each an object with its own dict. A cold repaint
of a 200×50 screen builds ~470 strips (each widget line, the styles cache's copy of it, the
compositor's pieces of it at every widget edge), and most of them use one cache or none:
the caches were ~6 600 of the repaint's ~7 700 new container objects, a sixth of its CPU
under cProfile, and the allocations that ran the cyclic collector ~11 times a repaint (its
gen-1 and gen-2 passes then walked the strips of the screen, all alive). :func:`install`
gives ``Strip`` an ``__init__`` that leaves those slots empty and a ``__getattr__`` that
fills one the first time a method reads it (an empty slot raises ``AttributeError``, which
Python turns into a ``__getattr__`` call), so a strip makes only the caches it uses and
behaves as before. Measured in ARCHITECTURE.md "Where a cold repaint of the grid goes".

The slots and cache sizes are Textual 8.2.8's (pinned exactly in pyproject.toml);
:func:`install` leaves ``Strip`` alone when its slots are not the ones expected here.
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.segment import Segment
from textual.cache import FIFOCache
from textual.strip import Strip

CACHE_SIZES: dict[str, int] = {
    "_divide_cache": 4,
    "_crop_cache": 16,
    "_style_cache": 16,
    "_filter_cache": 4,
    "_line_length_cache": 4,
    "_crop_extend_cache": 4,
    "_offsets_cache": 4,
}
"""Each cache slot of ``Strip`` and the size its ``__init__`` gives it."""
OTHER_SLOTS = ("_segments", "_cell_length", "_render_cache", "_link_ids", "_cell_count")
"""The slots ``__init__`` still sets."""
TEXTUAL_INIT = Strip.__init__
"""``Strip.__init__`` as Textual wrote it (tests/tui/test_strips.py compares against it)."""


def _init(self: Strip, segments: Iterable[Segment], cell_length: int | None = None) -> None:
    self._segments = list(segments)
    self._cell_length = cell_length
    self._render_cache = None
    self._link_ids = None
    self._cell_count = None


def _cache_on_first_use(self: Strip, name: str) -> FIFOCache:
    """Called for a slot never set: a cache slot gets its (empty) cache now."""
    size = CACHE_SIZES.get(name)
    if size is None:
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
    cache: FIFOCache = FIFOCache(size)
    setattr(self, name, cache)
    return cache


def install() -> bool:
    """Make ``Strip`` build its caches on first use; True when it does (idempotent)."""
    if Strip.__init__ is _init:
        return True
    if set(Strip.__slots__) != {*CACHE_SIZES, *OTHER_SLOTS} or "__getattr__" in vars(Strip):
        return False
    Strip.__init__ = _init  # type: ignore[method-assign]
    Strip.__getattr__ = _cache_on_first_use  # type: ignore[attr-defined]
    return True
