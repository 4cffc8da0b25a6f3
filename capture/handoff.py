"""What the model thread hands to the writer thread: small item records and a byte-bounded queue.

The queue bounds the bytes that have been copied but not yet written (queued *and* being
written), so a slow disk makes the model thread wait instead of letting memory grow. The model
thread puts a token's items in one group (one lock round-trip) and only wakes the writer when
something is urgent (a flush, the end, a full batch); otherwise the writer wakes on its own every
``flush_interval`` seconds, which bounds the latency all the same: waking it at every token made
the model thread wait for the hand-off of the GIL and the lock (~0.3 ms a token).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any


class TensorItem:
    """One captured tensor: a private contiguous copy, or an alias of an earlier item.

    No ``__slots__``: the writer-side fields are class defaults, so the model thread sets only
    the seven fields it knows (this constructor runs for every captured tensor).
    """

    order = -1
    """Completion order of ``node`` at ``token``."""
    file = ""
    begin = 0
    end = 0
    stats: tuple[float, float, float, float, int, int] | None = None
    """``(max, min, mean, norm, nan, inf)`` (``capture/stats.py``), set by the writer."""
    dtype_name = ""
    shape: list[int] = []  # noqa: RUF012 - replaced per instance by the writer, never mutated
    done = False
    """Set by the writer once this item's bytes (if any) and statistics are final."""
    tail: str | None = None
    """The writer's cached end of this tensor's index line (shared by its aliases)."""
    seq = -1
    """Its number in the writer process's stream (``capture/writer_process.py``), once given."""

    def __init__(
        self,
        token: int,
        node: str,
        stem: str,
        tensor: Any,
        node_type: str,
        alias: TensorItem | None = None,
        dtype: Any = None,
    ) -> None:
        self.token = token
        self.node = node
        self.stem = stem
        self.tensor = tensor
        """The copy: a numpy array for host tensors (bf16/fp8 as same-size integer bits), a
        tensor on its device otherwise; ``None`` for an alias and once written."""
        self.dtype = dtype
        """The captured tensor's torch dtype."""
        self.node_type = node_type
        self.alias = alias
        """The earlier item holding the same bytes (an unmodified tensor seen again)."""
        self.nbytes = 0 if tensor is None else tensor.nbytes


class Placeholder:
    """Shape and dtype of a tensor that is indexed but not copied (sparse and other layouts)."""

    __slots__ = ("dtype", "nbytes", "shape")

    def __init__(self, shape: Any, dtype: Any) -> None:
        self.shape = tuple(shape)
        self.dtype = dtype
        self.nbytes = 0


class TokenItem:
    """A root forward call started: token number and (a copy of) the input ids it received."""

    __slots__ = ("ids", "nbytes", "token")

    def __init__(self, token: int, ids: Any) -> None:
        self.token = token
        self.ids = ids
        self.nbytes = 0 if ids is None else ids.numel() * ids.element_size()


class LineItem:
    """An index line built in the model thread (``follow`` and its ``error``), written as is."""

    __slots__ = ("nbytes", "obj")

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj
        self.nbytes = 0


class WeightItem:
    """A parameter dumped once (``dump_weight``): ``name`` is ``root.<module path>.<param>``."""

    __slots__ = ("begin", "end", "file", "nbytes", "node", "param", "tensor")

    def __init__(self, node: str, param: str, tensor: Any) -> None:
        self.node = node
        self.param = param
        self.tensor = tensor
        self.nbytes = tensor.numel() * tensor.element_size()
        self.file = ""
        self.begin = 0
        self.end = 0


class TopologyItem:
    """Rewrite the topology with the completion order seen at the first dumped token."""

    __slots__ = ("nbytes", "order")

    def __init__(self, order: dict[str, int]) -> None:
        self.order = order
        self.nbytes = 0


class StreamEvent:
    """A CUDA event recorded on the model thread's current stream after a group of clones.

    The writer waits for it before touching those clones: the model may run on a side stream,
    and the writer thread's own (default) stream is not ordered after it.
    """

    __slots__ = ("event", "nbytes")

    def __init__(self) -> None:
        import torch

        self.event = torch.cuda.Event()
        self.event.record()
        self.nbytes = 0

    def wait(self) -> None:
        self.event.synchronize()


class Marker:
    """Control: ``token_end`` (write what is pending now), ``flush`` (and signal), ``stop``."""

    __slots__ = ("done", "kind", "nbytes")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.done = threading.Event()
        self.nbytes = 0


class ByteQueue:
    """A FIFO of items bounded by the bytes it holds until the writer releases them."""

    def __init__(self, bound: int, batch_bytes: int) -> None:
        self.bound = bound
        self.batch_bytes = batch_bytes
        self._items: deque[Any] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._outstanding = 0
        """Bytes put and not yet released (queued plus being written)."""
        self._queued = 0
        self.pending_items = 0
        """Items put and not yet released: 0 means everything put so far is on disk."""
        self._urgent = False
        self._since = 0.0
        self.peak = 0
        """Largest ``outstanding`` seen: what the back-pressure test checks."""
        self.draining = False
        """Set when capture stopped: puts never wait, the writer drops what it takes."""

    def put(self, items: list[Any], nbytes: int, urgent: bool = False) -> None:
        with self._cond:
            while (
                not self.draining
                and self._outstanding > 0
                and self._outstanding + nbytes > self.bound
            ):
                self._cond.wait()
            was_empty = not self._items
            if was_empty:
                self._since = time.monotonic()
            self._items.extend(items)
            self._outstanding += nbytes
            self._queued += nbytes
            self.pending_items += len(items)
            if self._outstanding > self.peak:
                self.peak = self._outstanding
            if urgent or self._queued >= self.batch_bytes:
                self._urgent = True
                self._cond.notify_all()

    def take(self, interval: float) -> tuple[list[Any], int]:
        """Wait until something is urgent or the oldest item is ``interval`` seconds old;
        the items and the bytes they were put with (what :meth:`release` gives back)."""
        with self._cond:
            while True:
                if self._urgent:
                    break
                if self._items:
                    left = self._since + interval - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                else:
                    self._cond.wait(interval)
            items = list(self._items)
            self._items.clear()
            nbytes, self._queued = self._queued, 0
            self._urgent = False
            return items, nbytes

    def release(self, nbytes: int, nitems: int) -> None:
        with self._cond:
            self._outstanding -= nbytes
            self.pending_items -= nitems
            self._cond.notify_all()

    def drain(self) -> None:
        """Stop applying back-pressure (capture stopped): waiting puts go through."""
        with self._cond:
            self.draining = True
            self._cond.notify_all()

    @property
    def outstanding(self) -> int:
        return self._outstanding
