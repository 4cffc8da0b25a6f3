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

    ``__slots__`` (no instance dict): every captured tensor makes one in the model thread, the
    writer process makes one again, and each is read field by field by the writer; a slotted
    item is ~0.2 us cheaper to make and free (measured 0.61 -> 0.38 us with one field set
    after), on ~80 k items a 512-token tiny-Llama run, in each of those places.

    Fields the model thread knows: ``token``, ``node``, ``stem``, ``tensor`` (the copy: a numpy
    array for host tensors, bf16/fp8 as same-size integer bits, a tensor on its device
    otherwise; ``None`` for an alias and once written), ``node_type``, ``alias`` (the earlier
    item holding the same bytes: an unmodified tensor seen again), ``dtype`` (the captured
    tensor's torch dtype), ``nbytes``; ``order`` (completion order of ``node`` at ``token``),
    set by the hooks after. The writer's: ``file``/``begin``/``end`` (where the bytes are),
    ``stats`` (``(max, min, mean, norm, nan, inf)``, ``capture/stats.py``), ``dtype_name``,
    ``shape``, ``done`` (its bytes, if any, and statistics are final), ``tail`` (the cached end
    of its index line, shared by its aliases), ``seq`` (its number in the writer process's
    stream, ``capture/writer_process.py``, once given).
    """

    __slots__ = (
        "alias",
        "begin",
        "done",
        "dtype",
        "dtype_name",
        "end",
        "file",
        "nbytes",
        "node",
        "node_type",
        "order",
        "seq",
        "shape",
        "stats",
        "stem",
        "tail",
        "tensor",
        "token",
    )

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
        self.dtype = dtype
        self.node_type = node_type
        self.alias = alias
        self.nbytes = 0 if tensor is None else tensor.nbytes
        self.order = -1
        self.file = ""
        self.begin = 0
        self.end = 0
        self.stats: tuple[float, float, float, float, int, int] | None = None
        self.dtype_name = ""
        self.shape: Any = _NO_SHAPE
        self.done = False
        self.tail: str | None = None
        self.seq = -1


_NO_SHAPE: list[int] = []
"""The shape of an item the writer has not described yet (shared, never mutated)."""


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
