"""Reading the next pairs' payloads in a thread while the current pair is measured.

A large pair's time is two halves that each leave the GIL: copying its bytes out of the page
cache (``readinto``) and the compiled metric kernel (a ctypes call). One after the other they
add up; here a reader thread copies the chunks of the pairs ahead into a fixed ring of buffers
while the caller measures the chunk it holds, so on two cores a pair costs about the longer of
the two. Memory stays bounded by the ring (``slots`` chunk pairs), whatever the pairs add up to:
the reader waits for a free slot, and the caller frees one by asking for its next chunk.

Chunks come exactly as :func:`~.load.iter_chunks` (``reuse=True``) cuts and reads them, golden
before target, so the same bytes reach the metrics in the same order and a missing or truncated
file fails the same pair with the same one-line error.
"""

from __future__ import annotations

import io
import math
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.readers.load import (
    _check_container,
    _is_contiguous,
    canonical_dtype,
    fill,
    open_payload,
    storage_dtype,
)
from layerwatch.engine.records import Locator

SLOT_BYTES = 2 << 20
"""A slot holds as many whole chunk pairs as fit in this (at least one): one read a side and
one hand-off between the threads per slot. 1–16 chunks of 2^17 elements measured alike."""
RING_BYTES = 8 << 20
"""Slots in the ring: as many as fit in this, at least 2 (one measured, one being read), at
most 4. With the engine's chunks (2^17 elements, fp32 + bf16) 4 slots of 1.5 MB."""

_END = object()
"""A pair's last item: its chunks are all in."""


def _open_at(loc: Locator, item: int) -> io.FileIO:
    """``loc``'s file opened at its first element, after the container check ``iter_chunks``
    makes first."""
    _check_container(loc)
    fh = open_payload(loc)
    try:
        fh.seek(loc.offset + loc.elem_offset * item)
    except BaseException:
        fh.close()
        raise
    return fh


def prefetchable(golden: Locator, target: Locator) -> bool:
    """Both payloads contiguous, non-empty and of the same element count (what the ring
    reads); anything else is read by the caller itself, as before."""
    for loc in (golden, target):
        if loc.layout:
            return False
        shape = tuple(int(d) for d in loc.shape)
        strides = tuple(int(s) for s in loc.strides) if loc.strides is not None else None
        if not _is_contiguous(shape, strides):
            return False
        try:
            canonical_dtype(loc.dtype)
        except Exception:  # the caller reports an unknown dtype
            return False
    total = math.prod(golden.shape)
    return total > 0 and total == math.prod(target.shape)


class PayloadPrefetch:
    """Reads ``pairs`` (golden, target locators), in order, ``chunk_elems`` elements a chunk,
    ``per_slot`` chunks at a time into ``slots`` reused buffer pairs, from a daemon thread
    (both sized from :data:`SLOT_BYTES` and :data:`RING_BYTES` unless given). :meth:`take` hands one pair's
    chunks to the caller; pairs the caller skips are dropped unread or read and discarded."""

    def __init__(
        self,
        pairs: Sequence[tuple[Locator, Locator]],
        chunk_elems: int,
        slots: int | None = None,
        per_slot: int | None = None,
    ) -> None:
        self._pairs = list(pairs)
        self._where = {(id(g), id(t)): i for i, (g, t) in enumerate(self._pairs)}
        widest = [1, 1]
        for g, t in self._pairs:
            widest[0] = max(widest[0], storage_dtype(g.dtype).itemsize)
            widest[1] = max(widest[1], storage_dtype(t.dtype).itemsize)
        chunk_bytes = chunk_elems * sum(widest)
        per_slot = per_slot or max(1, SLOT_BYTES // chunk_bytes)
        slots = slots or min(4, max(2, RING_BYTES // (per_slot * chunk_bytes)))
        self._chunk = chunk_elems
        self._span = chunk_elems * per_slot  # elements a slot holds
        self._next = 0  # the first pair the caller has not taken yet
        self._held: list[np.ndarray] | None = None  # the slot whose views the caller holds
        from queue import SimpleQueue  # here: a compare without large pairs never imports it

        self._free: SimpleQueue[list[np.ndarray] | None] = SimpleQueue()
        self._ready: SimpleQueue[tuple[int, Any]] = SimpleQueue()
        self._stop = False
        for _ in range(slots):
            self._free.put([np.empty(self._span * w, np.uint8) for w in widest])
        self.slots = slots
        self.slot_bytes = self._span * sum(widest)
        """Bytes of one slot: the ring holds ``slots`` of them, never more."""
        self.bytes_read = 0
        """Payload bytes the reader has put in the ring so far (the caller has taken at most
        ``slots`` slots' worth fewer)."""
        self._thread = threading.Thread(target=self._run, name="layerwatch-prefetch", daemon=True)
        self._thread.start()

    # --- the reader thread ----------------------------------------------------------------
    def _run(self) -> None:
        for index, (golden, target) in enumerate(self._pairs):
            if self._stop:
                return
            try:
                if not self._read_pair(index, golden, target):
                    return
                self._ready.put((index, _END))
            except Exception as exc:  # the caller raises it for this pair (a one-line reason)
                self._ready.put((index, exc))

    def _read_pair(self, index: int, golden: Locator, target: Locator) -> bool:
        """Put every chunk pair of ``index`` in the ring; False when told to stop.

        A slot is filled with one read a side (each read lets go of the GIL and takes it back:
        per chunk that hand-over cost the reader more than the copy under a busy box). When a
        read fails, the slot is read again chunk by chunk in the caller's own order (golden 0,
        target 0, golden 1...; a file opened at its first chunk), so the error raised is the
        first one the caller would meet."""
        total = math.prod(golden.shape)
        locs = (golden, target)
        items = (storage_dtype(golden.dtype).itemsize, storage_dtype(target.dtype).itemsize)
        handles: list[io.FileIO | None] = [None, None]
        try:
            for first in range(0, total, self._span):
                slot = self._free.get()
                if slot is None or self._stop:
                    return False
                count = min(self._span, total - first)
                try:
                    try:
                        for side in (0, 1):
                            fh = handles[side]
                            if fh is None:
                                fh = handles[side] = _open_at(locs[side], items[side])
                            fill(
                                fh, slot[side].data, count * items[side], locs[side], first + count
                            )
                    except (LayerwatchError, OSError):
                        self._read_in_order(slot, first, count, locs, items, handles)
                except BaseException:
                    self._free.put(slot)
                    raise
                self.bytes_read += count * (items[0] + items[1])
                self._ready.put((index, (slot, count)))
        finally:
            for fh in handles:
                if fh is not None:
                    fh.close()
        return True

    def _read_in_order(
        self,
        slot: list[np.ndarray],
        first: int,
        count: int,
        locs: tuple[Locator, Locator],
        items: tuple[int, int],
        handles: list[io.FileIO | None],
    ) -> None:
        """The slot's chunks read one by one as the caller reads them (raises its error)."""
        for side in (0, 1):
            fh = handles[side]
            if fh is not None:
                loc = locs[side]
                fh.seek(loc.offset + (loc.elem_offset + first) * items[side])
        for start in range(first, first + count, self._chunk):
            n = min(self._chunk, first + count - start)
            for side in (0, 1):
                fh = handles[side]
                if fh is None:  # this side's first chunk: open it
                    fh = handles[side] = _open_at(locs[side], items[side])
                at = (start - first) * items[side]
                view = slot[side].data[at : at + n * items[side]]
                fill(fh, view, n * items[side], locs[side], start + n)

    # --- the caller -----------------------------------------------------------------------
    def take(
        self, golden: Locator, target: Locator
    ) -> Iterator[tuple[np.ndarray, np.ndarray]] | None:
        """The stored chunks of this pair (golden, target in their storage dtypes), or ``None``
        when it is not one of the pairs read ahead (or was passed already). Each chunk's
        buffers are the caller's until it asks for the next chunk."""
        index = self._where.get((id(golden), id(target)))
        if index is None or index < self._next or self._stop:
            return None
        self._next = index + 1
        return self._chunks(index, storage_dtype(golden.dtype), storage_dtype(target.dtype))

    def _chunks(
        self, index: int, g_dtype: np.dtype, t_dtype: np.dtype
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        g_item, t_item = g_dtype.itemsize, t_dtype.itemsize
        while True:
            self._release()
            at, what = self._ready.get()
            if at < index:  # a pair the caller skipped or left part-way
                if isinstance(what, tuple):
                    self._free.put(what[0])
                continue
            if what is _END:
                return
            if isinstance(what, BaseException):
                raise what
            slot, count = what
            self._held = slot
            g = slot[0][: count * g_item].view(g_dtype)
            t = slot[1][: count * t_item].view(t_dtype)
            step = self._chunk
            for start in range(0, count, step):  # the caller's chunks, cut as iter_chunks cuts
                yield g[start : start + step], t[start : start + step]

    def _release(self) -> None:
        if self._held is not None:
            self._free.put(self._held)
            self._held = None

    def close(self) -> None:
        """Stop the reader (it may be waiting for a slot) and wait for it."""
        self._stop = True
        self._release()
        self._free.put(None)
        self._thread.join()

    def __enter__(self) -> PayloadPrefetch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
