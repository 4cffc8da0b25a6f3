"""Keeping CPython's cyclic garbage collector from pausing a long-running live comparison.

A live session holds the records and results of the tokens not yet settled, their indexes and
cells, and the imported libraries (transformers alone ~340 k objects): the heap holds millions
of objects, and each full (generation-2) collection walks all of them while holding the GIL —
0.1-0.5 s in which neither the engine worker nor the TUI's thread runs
(``tests/bench/bench_gc.py``). Most of them live until the end or until their token settles
and reference counting frees them, so walking them finds nothing. Two measures:

- :func:`settle` after start-up: one collection, then ``gc.freeze()`` — imported modules and
  the start-up heap move to the permanent generation and are never walked again;
- :class:`HeapFreezer`, ticked by the engine worker after each flush: at most every
  ``every_s`` seconds, a collection (over what was allocated since the last freeze only, so
  it is short) and a freeze. What is garbage is freed before freezing; reference counting
  still frees frozen objects as usual (a settled token's records go that way). The cost: a
  frozen object that *later* becomes part of an unreachable reference cycle is not reclaimed
  (the session's records and results do not form cycles; a closed TUI screen does — a few hundred kilobytes per drill-down at most).

Raising the thresholds alone does not help: it only makes collections of young objects rarer
and longer (measured in the benchmark).

The same tick gives the C heap's free pages back (:func:`trim_heap`). A live session frees
each token's records and results once the token settles, but the survivors of every round (a
token's index entry, its cells, a string) land between them, so glibc's heap keeps the freed
pages: RSS grew ~150 bytes a pair of `open --headless` while the traced Python heap grew ~15
(tests/bench/bench_scale.py ``--session-only``); ``malloc_trim`` each second keeps it flat.
"""

from __future__ import annotations

import ctypes
import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to give back this way
        return None


_TRIM = _malloc_trim()


def trim_heap() -> bool:
    """Return the C heap's free pages to the system (glibc ``malloc_trim``); False where
    there is no such call."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


FREEZE_EVERY_S = 1.0
"""Seconds between freezes while results keep arriving."""


def settle() -> None:
    """Collect once and freeze what survived (call after start-up, before streaming)."""
    gc.collect()
    gc.freeze()


class HeapFreezer:
    """Freezes the heap now and then, so collections only ever walk recent objects."""

    def __init__(self, every_s: float = FREEZE_EVERY_S) -> None:
        self.every_s = every_s
        self._next = time.monotonic() + every_s

    def tick(self) -> None:
        """Call after each flush: collect and freeze when ``every_s`` has passed."""
        now = time.monotonic()
        if now < self._next:
            return
        gc.collect()
        gc.freeze()
        trim_heap()
        self._next = time.monotonic() + self.every_s


BATCH_THRESHOLDS = (10_000, 20, 100)
"""The collector's thresholds while a headless ``compare`` runs (CPython's: 700, 10, 10)."""

FROZEN_BATCH_THRESHOLDS = (200_000, 100, 100)
"""The thresholds of a headless live session (``open``/``watch``/``run --headless``), whose
:class:`HeapFreezer` collects and freezes once a second anyway: young collections wait for
200 000 more live containers than freed ones, so between two ticks they rarely run and the
freezer's collection does their work once. With :data:`BATCH_THRESHOLDS` the young
collections walked each surviving pair's objects again until the tick (on bench_scale's
100 k pairs ~275 young and ~13 middle collections, 0.75-0.86 s of ~10 s CPU; with these ~50
young ones, 0.13 s, peak RSS the same). Cyclic garbage waits at most that many containers,
or the next tick."""


@contextmanager
def batch_collections(thresholds: tuple[int, int, int] = BATCH_THRESHOLDS) -> Iterator[None]:
    """Rarer collections inside the block (``thresholds``: :data:`BATCH_THRESHOLDS`, or
    :data:`FROZEN_BATCH_THRESHOLDS` where a :class:`HeapFreezer` ticks); the thresholds found
    before are put back after it, unless something else changed them meanwhile.

    A headless compare of many small pairs allocates a few dozen container objects a pair
    (records, keys, results, report lines), nearly all freed by reference counting within
    its window: with CPython's thresholds the collector ran ~4 800 times for 100 k pairs,
    36 of them full collections over the whole heap, 1.7-1.9 s of 12-17 s CPU; with these,
    ~230 times and one full collection, 0.45-0.6 s (bench_scale's 100 k-pair dump, in one
    process, three alternations, load 4.5 on the 2 shared cores). No freeze: a compare
    called in-process (tests, ``open`` of per-case dumps) leaves the caller's heap as it was.
    Unlike the live session (the module docstring), nothing here runs beside a UI thread, so
    a young collection that is rarer and longer costs no frame."""
    before = gc.get_threshold()
    gc.set_threshold(*thresholds)
    try:
        yield
    finally:
        if gc.get_threshold() == thresholds:
            gc.set_threshold(*before)
