"""The hook functions and the per-token state of one capture (one ``register_hook`` call).

Runs in the model thread, so it does as little as possible per module call: copy each selected
tensor once (a contiguous clone on its own device, taken before anything later can modify it in
place), skip the copy when the tensor is the same, unmodified object as one already captured at
this token (same ``id`` and ``_version``: the next module's input is usually the previous
module's output), and hand the items of one call to the writer queue with one ``put``.

Token = index of the root module's forward call (0 = prefill); completion order = the order in
which modules' forward hooks fire at a token (inner before outer).
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import torch

from .config import DumpConfig
from .copies import HOST_NUMPY, copy_tensor
from .flatten import first_int_tensor, flatten_inputs, flatten_output
from .handoff import ByteQueue, TensorItem, TokenItem, TopologyItem
from .safetensors_file import DTYPE_NAMES, dtype_name

Tensor = torch.Tensor


LOCAL_BYTES = 4 << 20
"""Items are handed to the writer queue in groups of about this many bytes (or at token end)."""
LOCAL_ITEMS = 1024

Record = tuple[int, str, str, str, Any, "str | None", int, int]
"""A captured tensor as the writer process's path takes it (:attr:`Recorder.records`):
``(token, node, stem, node_type, copy, dtype name, seq, nbytes)``; an alias has no copy and no
dtype name, and ``seq`` is its source's (a fresh copy's own number, unique in the run). The
model thread builds a tuple (~0.07 us) instead of a :class:`TensorItem` (~0.7 us), and the
writer thread makes items only of the batches it writes itself (``capture/writer_process.py``).
A module call's records go to the queue as one group ``(order, [records])``."""


def _version(t: Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # inference-mode tensors have no version counter: never de-duplicate
        return None


def _copy(t: Tensor) -> Any:
    """A copy of ``t``'s data that outlives the step (copy_tensor's common case inline: a host
    tensor numpy can hold; the general path for the rest: requires_grad, conjugate bits...)."""
    try:
        return t.numpy().copy() if t.dtype in HOST_NUMPY and t.is_cpu else copy_tensor(t)
    except (RuntimeError, TypeError):
        return copy_tensor(t)


class Recorder:
    """Per-capture state; its bound methods are the hooks ``register_hook`` installs."""

    def __init__(self, config: DumpConfig, queue: ByteQueue, report: Any) -> None:
        self.tokens = config.tokens
        self.last_logits = config.dump_last_logits
        self.queue = queue
        self.report = report
        """``report(exc)``: called once when a hook hits an unexpected error (capture stops)."""
        self.next_token = 0
        """Root forward calls seen so far (the next token's number)."""
        self.token = -1
        self.active = False
        """Capturing the current token (inside a root call whose token is selected)."""
        self.stopped = False
        self.paused = False
        """Per-case capture outside the listed cases (``capture/cases.py``): tokens not captured."""
        self.depth = 0
        self.order = 0
        self.last_order = -1
        self.seen: dict[int, tuple[Any, int, Any]] = {}
        """``id`` -> (weak reference, version, the item or, for records, its ``seq``)."""
        self.calls: dict[str, int] = {}
        self.frames: list[tuple[Any, str, list[TensorItem]]] = []
        """Inputs taken by pre-hooks, waiting for their module's forward hook (call nesting)."""
        self.leaf: tuple[str, str, Tensor, int | None, int] | None = None
        self.order_map: dict[str, int] | None = None
        self.topology_sent = False
        self.late_root: tuple[str, bool] | None = None
        """Set when attached from inside the root's first call without its arguments."""
        self.warned: set[str] = set()
        self.batch: list[Any] = []
        """Items not yet handed to the queue (one ``put`` per group, not per module call)."""
        self.batch_bytes = 0
        self.local_bytes = min(LOCAL_BYTES, queue.bound // 4)
        """Hand over at this many bytes, so one put stays well below the queue's bound."""
        self.last_token = self.tokens.last
        self.after_last: Any = None
        """Called once after the last selected token (``register_hook`` removes module hooks)."""
        self.stream_event: Any = None
        """For CUDA models: makes a ``StreamEvent`` recorded on the model thread's stream."""
        self.records = False
        """Capture as :data:`Record` tuples in ``(order, records)`` groups (the writer process's
        writer asks for them: ``capture/writer_process.py``), not :class:`TensorItem` objects."""
        self.seq = 0
        """The next fresh copy's number (records only)."""
        self.batch_count = 0
        """Tensors in :attr:`batch` (records only: a group holds several)."""

    def use_records(self) -> None:
        """Capture as :data:`Record` tuples from now on (before the first token)."""
        self.records = True
        self.capture_one = self._record_one  # type: ignore[method-assign,assignment]

    def stop(self, _reason: object = None) -> None:
        self.stopped = True
        self.active = False

    def detach(self) -> None:
        """Hooks are being removed: hand over what is pending, then capture nothing more."""
        if not self.stopped:
            self.hand_over(urgent=True)
        self.stop()

    # --- tokens ---------------------------------------------------------------------------
    def begin_token(self, args: tuple[Any, ...] | None, kwargs: dict[str, Any] | None) -> None:
        token = self.next_token
        self.next_token = token + 1
        self.token = token
        self.order = 0
        self.seen.clear()
        self.calls.clear()
        self.frames.clear()
        self.leaf = None
        self.active = not self.stopped and not self.paused and token in self.tokens
        if self.active and not self.topology_sent and self.order_map is None:
            self.order_map = {}
        if self.stopped or args is None:
            return
        ids = first_int_tensor(args, kwargs)
        item = TokenItem(token, None if ids is None else ids.detach().to("cpu", copy=True))
        self.batch.append(item)
        if not self.active:
            self.hand_over(urgent=False)

    def root_pre(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        if self.depth:
            self.depth += 1
            return
        self.depth = 1
        try:
            self.begin_token(args, kwargs)
        except Exception as exc:
            self.fail(exc)

    def root_post(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        if self.depth > 1:
            self.depth -= 1
            return
        self.depth = 0
        if not self.active:
            return
        if self.last_token is not None and self.token >= self.last_token and self.after_last:
            self.after_last()  # no later token is selected: drop the per-module hooks
            self.after_last = None
        try:
            if self.late_root is not None:
                type_, want_inputs = self.late_root
                self.late_root = None
                ids = first_int_tensor(args, kwargs)
                token = TokenItem(
                    self.token, None if ids is None else ids.detach().to("cpu", copy=True)
                )
                self.batch.append(token)
                self.batch_bytes += token.nbytes
                if want_inputs:
                    found = self.capture(flatten_inputs(args, kwargs), "root", type_)
                    if found:
                        self.emit(self.last_order, found)
            if self.leaf is not None:
                self.emit_logits()
            if self.order_map is not None:
                self.batch.append(TopologyItem(self.order_map))
                self.order_map = None
                self.topology_sent = True
            # Not urgent: the writer's timer writes it within flush_interval (the live view's
            # latency budget); waking the writer at every token costs more than it gains.
            self.hand_over(urgent=False)
        except Exception as exc:
            self.fail(exc)
        finally:
            self.active = False

    def hand_over(self, urgent: bool) -> None:
        """Put the pending group into the writer queue (may wait: back-pressure)."""
        batch, nbytes = self.batch, self.batch_bytes
        self.batch, self.batch_bytes, self.batch_count = [], 0, 0
        if self.stream_event is not None and batch:
            batch.append(self.stream_event())  # device copies are complete once this fires
        if batch or urgent:
            self.queue.put(batch, nbytes, urgent=urgent)

    def begin_in_call(
        self,
        module: torch.nn.Module,
        type_: str,
        want_inputs: bool,
        args: tuple[Any, ...] | None,
        kwargs: dict[str, Any] | None,
    ) -> None:
        """Attached from inside the root's first forward call: start token 0 by hand."""
        self.depth = 1
        if args is None or kwargs is None:  # e.g. a global pre-hook: it never sees kwargs
            self.begin_token(None, None)
            self.late_root = (type_, want_inputs)
        else:
            self.begin_token(args, kwargs)
            if want_inputs:
                self.pre("root", type_, module, args, kwargs)

    # --- every module ---------------------------------------------------------------------
    def pre(
        self,
        name: str,
        type_: str,
        module: torch.nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        if not self.active:
            return
        try:
            n = self.calls.get(name, 0)
            self.calls[name] = n + 1
            node = name if n == 0 else f"{name}#{n}"
            if not kwargs and len(args) == 1 and isinstance(args[0], Tensor):
                items = [self.capture_one("input_0", args[0], node, type_)]
            else:
                items = self.capture(flatten_inputs(args, kwargs), node, type_)
            self.frames.append((module, node, items))
        except Exception as exc:
            self.fail(exc)

    def post(
        self,
        name: str,
        type_: str,
        has_pre: bool,
        want_out: bool,
        is_leaf: bool,
        module: torch.nn.Module,
        args: tuple[Any, ...],
        output: Any,
    ) -> None:
        if not self.active:
            return
        try:
            order = self.order
            self.order = order + 1
            self.last_order = order
            if self.order_map is not None and name not in self.order_map:
                self.order_map[name] = order
            items: list[TensorItem] = []
            node = name
            if has_pre:
                frames = self.frames
                if frames and frames[-1][0] is module:
                    _, node, items = frames.pop()
                else:  # a module in between raised, or a re-entrant call: search the stack
                    node, items = self._frame(module, name)
            elif want_out:
                n = self.calls.get(name, 0)
                self.calls[name] = n + 1
                if n:
                    node = f"{name}#{n}"
            if want_out:
                if isinstance(output, Tensor):
                    items.append(self.capture_one("output", output, node, type_))
                else:
                    items.extend(self.capture(flatten_output(output), node, type_))
            if (
                is_leaf
                and self.last_logits
                and isinstance(output, Tensor)
                and output.is_floating_point()
            ):
                self.leaf = (node, type_, output, _version(output), order)
            if items:
                self.emit(order, items)
        except Exception as exc:
            self.fail(exc)

    def emit(self, order: int, items: list[Any]) -> None:
        """Add one node's captured tensors (completion ``order``) to the pending group."""
        nbytes = self.batch_bytes
        if self.records:
            for rec in items:
                nbytes += rec[7]
            self.batch.append((order, items))
            count = self.batch_count = self.batch_count + len(items)
        else:
            for it in items:
                it.order = order
                nbytes += it.nbytes
            self.batch.extend(items)
            count = len(self.batch)
        self.batch_bytes = nbytes
        if nbytes >= self.local_bytes or count >= LOCAL_ITEMS:
            self.hand_over(urgent=False)

    def _frame(self, module: Any, name: str) -> tuple[str, list[TensorItem]]:
        frames = self.frames
        for i in range(len(frames) - 1, -1, -1):
            if frames[i][0] is module:
                _, node, items = frames.pop(i)
                del frames[i:]  # frames above it belong to calls that never returned
                return node, items
        return name, []

    def _unchanged(self, t: Tensor) -> tuple[int | None, Any]:
        """(``t``'s version counter, what captured it last when it has not changed since, else
        None): one copy serves a tensor that several nodes pass on."""
        version = _version(t)
        if version is None:
            return None, None
        hit = self.seen.get(id(t))
        if hit is not None and hit[1] == version and hit[0]() is t:
            return version, hit[2]
        return version, None

    def capture_one(self, stem: str, t: Tensor, node: str, type_: str) -> TensorItem:
        """One tensor as a :class:`TensorItem`: a copy, or an alias of an unchanged one."""
        version, hit = self._unchanged(t)
        if hit is not None:
            return TensorItem(self.token, node, stem, None, type_, hit)
        item = TensorItem(self.token, node, stem, _copy(t), type_, None, t.dtype)
        if version is not None:
            self.seen[id(t)] = (weakref.ref(t), version, item)
        return item

    def capture(self, pairs: list[tuple[str, Tensor]], node: str, type_: str) -> list[Any]:
        """:meth:`capture_one` for each (stem, tensor) (in ``records`` mode, as records)."""
        one = self.capture_one
        return [one(stem, t, node, type_) for stem, t in pairs]

    def emit_logits(self) -> None:
        node, type_, t, version, order = self.leaf  # type: ignore[misc]
        self.leaf = None
        if version is not None and _version(t) != version and "logits" not in self.warned:
            self.warned.add("logits")
            print(
                f"layerwatch: the logits of {node} were modified in place later in the step; "
                "dumping their final values",
                file=sys.stderr,
            )
        data = copy_tensor(t)
        if self.records:
            self.emit(order, [self._fresh(node, "output", type_, data, t.dtype)])
        else:
            self.emit(order, [TensorItem(self.token, node, "output", data, type_, None, t.dtype)])

    def _fresh(self, node: str, stem: str, type_: str, data: Any, dtype: Any) -> Record:
        seq = self.seq
        self.seq = seq + 1
        name = DTYPE_NAMES.get(dtype) or dtype_name(dtype)
        return (self.token, node, stem, type_, data, name, seq, data.nbytes)

    def _record_one(self, stem: str, t: Tensor, node: str, type_: str) -> Record:
        """:meth:`capture_one` as a :data:`Record` (``records`` mode). The one-tensor path of
        every hook call (~80 k a 512-token tiny-Llama run): :meth:`_unchanged`, :func:`_copy`
        and :meth:`_fresh` inline, each call saved is ~0.1 us a tensor."""
        try:
            version = t._version
        except RuntimeError:  # inference-mode tensors have no version counter: never de-duplicate
            version = None
        else:
            hit = self.seen.get(id(t))
            if hit is not None and hit[1] == version and hit[0]() is t:
                return (self.token, node, stem, type_, None, None, hit[2], 0)
        dtype = t.dtype
        try:
            data = t.numpy().copy() if dtype in HOST_NUMPY and t.is_cpu else copy_tensor(t)
        except (RuntimeError, TypeError):
            data = copy_tensor(t)
        seq = self.seq
        self.seq = seq + 1
        if version is not None:
            self.seen[id(t)] = (weakref.ref(t), version, seq)
        name = DTYPE_NAMES.get(dtype) or dtype_name(dtype)
        return (self.token, node, stem, type_, data, name, seq, data.nbytes)

    def fail(self, exc: BaseException) -> None:
        self.stop()
        self.report(exc)
