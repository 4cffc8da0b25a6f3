"""``register_hook(model, config) -> HookHandle``: msit's entry point, without its defects.

* No process-wide state besides the set of open handles (closed at interpreter exit so a
  script that never calls ``close()``, as msit scripts do not, still ends with a complete
  dump): two models, two handles, two independent runs; ``remove()`` really removes.
* Inputs are taken in a forward *pre*-hook (with keyword arguments), outputs in the forward
  hook (for a module with no hook of its own, both run from one wrapper of its ``forward``,
  :class:`ForwardWrap`, which keeps torch's fast call path); every tensor is copied at once
  (``capture/recorder.py``) and written by a background thread (``capture/writer.py`` or
  ``capture/msit_writer.py``); for host models, once a run is long, the thread hands the run
  over to a writer process off the model's GIL (``capture/writer_process.py``).
* Attaching from inside the root's first forward call (the zero-code-change bootstrap finds
  the root in a *global* forward pre-hook, when the root's own pre-hooks for that call are
  already fixed): ``register_hook(root, config, already_in_call=True, call_args=args,
  call_kwargs=kwargs)`` counts that call as token 0 and names everything as usual.
"""

from __future__ import annotations

import atexit
import os
import sys
from functools import partial
from pathlib import Path
from typing import Any

import torch

from . import cases, heap
from . import format as fmt
from .collectives import CollectivePatch, RankInfo, rank_info
from .config import DumpConfig
from .errors import LayerwatchError
from .handoff import LineItem, WeightItem
from .recorder import Recorder
from .seed import seed_all
from .topology import build_topology, named_nodes
from .writer_thread import WriterThread

_OPEN: set[HookHandle] = set()
"""Handles not closed yet: closed by ``atexit``, disabled in a forked child."""


class HookHandle:
    """One capture of one model. ``close()`` when done (or leave the ``with`` block)."""

    def __init__(
        self,
        recorder: Recorder | None,
        writer: WriterThread | None,
        handles: list[Any],
        run_dir: Path | None,
    ) -> None:
        self._recorder = recorder
        self._writer = writer
        self._handles = handles
        self.run_dir = run_dir
        """The directory this capture writes (``{device}_{pid}``), ``None`` if it captures nothing."""
        self._holds_heap = False
        """This capture froze the heap (``capture/heap.py``): it thaws it when it closes."""
        if writer is not None:
            _OPEN.add(self)
            self._holds_heap = heap.hold()

    def remove(self) -> None:
        """Remove every hook: the model runs exactly as before. Queued tensors are still written."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._recorder is not None:
            self._recorder.detach()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every tensor captured so far is on disk; ``False`` on timeout."""
        return True if self._writer is None else self._writer.flush(timeout)

    def close(self) -> None:
        """Remove the hooks, write everything still queued and the end records, and wait for it."""
        self.remove()
        if self._writer is not None:
            self._writer.close()
        _OPEN.discard(self)
        if self._holds_heap:
            self._holds_heap = False
            heap.release()

    @property
    def on_disk(self) -> bool:
        """Cheap check: everything captured so far has been written (or dropped after a failure)."""
        return self._writer is None or self._writer.queue.pending_items == 0

    @property
    def failed(self) -> str | None:
        """Why capture stopped early (disk full...), or ``None``."""
        return None if self._writer is None else self._writer.failed

    @property
    def tokens(self) -> int:
        """Root forward calls seen so far."""
        return 0 if self._recorder is None else self._recorder.next_token

    @property
    def queue_peak_bytes(self) -> int:
        """Most bytes held by the copy queue at once (bounded by ``DumpConfig.queue_bytes``)."""
        return 0 if self._writer is None else self._writer.queue.peak

    def __enter__(self) -> HookHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def register_hook(
    model: torch.nn.Module,
    config: DumpConfig | None = None,
    *,
    already_in_call: bool = False,
    call_args: tuple[Any, ...] | None = None,
    call_kwargs: dict[str, Any] | None = None,
) -> HookHandle:
    """Capture ``model`` as ``config`` says; returns the handle that stops it.

    ``already_in_call``: the caller is inside a forward pre-hook of ``model`` (e.g. a global
    one), so this call of ``model`` is token 0. Pass the call's ``call_args`` *and*
    ``call_kwargs`` when both are known (its input ids and the root's inputs are then taken
    now); otherwise (a global pre-hook never sees keyword arguments) they are read from the
    root's forward hook at the end of that call.
    """
    if not isinstance(model, torch.nn.Module):
        raise LayerwatchError(f"register_hook needs a torch.nn.Module, got {type(model).__name__}")
    config = DumpConfig() if config is None else config
    if not isinstance(config, DumpConfig):
        raise LayerwatchError(f"register_hook needs a DumpConfig, got {type(config).__name__}")
    if config.seed is not None:
        seed_all(config.seed)
    device = model_device(model)
    if config.device_id is not None and device.type != "cpu" and device.index != config.device_id:
        return HookHandle(None, None, [], None)
    ranks = rank_info()
    writer = _make_writer(model, config, device, ranks)
    recorder = Recorder(config, writer.queue, lambda exc: writer.fail(exc, "a capture hook"))
    writer.on_failure.append(recorder.stop)
    if writer.takes_records:
        recorder.use_records()
    if device.type == "cuda":
        from .handoff import StreamEvent

        recorder.stream_event = StreamEvent
    hooks: list[Any] = [  # torch hook handles and cases.Registration: each has remove()
        model.register_forward_pre_hook(recorder.root_pre, with_kwargs=True, prepend=True)
    ]
    root_type = type(model).__name__
    root_inputs = False
    for name, module in named_nodes(model):
        type_ = type(module).__name__
        selected = not config.dump_last_logits and config.selects(name, module)
        has_pre = selected and config.want_inputs
        want_out = selected and config.tensor_part in (1, 2)
        is_leaf = next(module.children(), None) is None
        pre = partial(recorder.pre, name, type_) if has_pre else None
        post = partial(recorder.post, name, type_, has_pre, want_out, is_leaf)
        if module is model or module._forward_hooks or module._forward_pre_hooks:
            # the root's own hooks, and a user's, keep their order against ours: torch's hooks
            if pre is not None:
                hooks.append(module.register_forward_pre_hook(pre, with_kwargs=True))
                root_inputs = root_inputs or module is model
            hooks.append(module.register_forward_hook(post))
        else:
            hooks.append(ForwardWrap(module, pre, post))
    hooks.append(
        model.register_forward_hook(recorder.root_post, with_kwargs=True, always_call=True)
    )
    module_hooks = hooks[1:-1]
    emit = lambda obj: writer.queue.put([LineItem(obj)], 0)  # noqa: E731 (one index line)
    marker = cases.CaseMarker(
        emit, lambda: recorder.next_token, config.case_keys, partial(setattr, recorder, "paused")
    )
    hooks.append(cases.attach(model, marker, already_in_call))  # removed with the hooks
    if ranks is not None:  # collectives are wrapped during each root call (capture/collectives.py)
        names = {id(module): name for name, module in named_nodes(model)}
        patch = CollectivePatch(recorder, ranks, config, names)
        hooks.append(model.register_forward_pre_hook(patch.install))
        hooks.append(model.register_forward_hook(patch.restore, always_call=True))
        hooks.append(_Restore(patch))
        if already_in_call:
            patch.install()
    if config.golden is not None:  # after the capture's hooks: they copy the logits first
        from .follow import Follower

        follower = Follower(config.golden, emit)
        hooks.append(model.register_forward_pre_hook(follower.pre, with_kwargs=True))
        hooks.append(model.register_forward_hook(follower.post, with_kwargs=True))
    writer.start()
    handle = HookHandle(recorder, writer, hooks, writer.run_dir)

    def drop_module_hooks() -> None:  # the root's two hooks stay: token ids keep being recorded
        for hook in module_hooks:
            hook.remove()

    recorder.after_last = drop_module_hooks
    if config.dump_weight:
        _queue_weights(model, config, writer)
    if already_in_call:
        recorder.begin_in_call(model, root_type, root_inputs, call_args, call_kwargs)
    return handle


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's last parameter (msit's rule), CPU for a parameterless model."""
    device = torch.device("cpu")
    for param in model.parameters():
        device = param.device
    return device


def device_label(device: torch.device) -> str:
    """``cpu`` / ``cuda0`` / ``npu3``: msit's rank directory prefix."""
    return device.type if device.index is None else f"{device.type}{device.index}"


_NOT_SET = object()


class ForwardWrap:
    """Our two hooks of one module as one wrapper of its ``forward`` (an instance attribute).

    A module with no hook of its own takes torch's fast path (``Module._call_impl`` calls
    ``self.forward`` directly when no hook dict holds anything), so a wrapper there skips the
    hook dispatch that two torch hooks cost each call (~0.24 s of the model thread's CPU on the
    512-token tiny-Llama run, ``tests/bench/bench_dump.py``). Only for modules without hooks at
    registration (``register_hook``): a user's hooks keep running in torch's order around ours.
    ``remove()`` puts back exactly what was there (the class's ``forward`` or an instance
    attribute set before us); if something wrapped ``forward`` over ours since, ours stays in
    its chain, inert: the recorder is stopped or past its last token by then.
    """

    __slots__ = ("module", "previous", "wrapper")

    def __init__(self, module: torch.nn.Module, pre: Any, post: Any) -> None:
        self.module = module
        self.previous = vars(module).get("forward", _NOT_SET)
        inner = module.forward
        if pre is None:

            def forward(*args: Any, **kwargs: Any) -> Any:
                out = inner(*args, **kwargs)
                post(module, args, out)
                return out
        else:

            def forward(*args: Any, **kwargs: Any) -> Any:
                pre(module, args, kwargs)
                out = inner(*args, **kwargs)
                post(module, args, out)
                return out

        # inspect.signature(module.forward) still sees the module's own signature
        forward.__wrapped__ = inner  # type: ignore[attr-defined]
        self.wrapper = forward
        module.forward = forward

    def remove(self) -> None:
        module = self.module
        if vars(module).get("forward") is self.wrapper:
            if self.previous is _NOT_SET:
                del module.forward
            else:
                module.forward = self.previous


class _Restore:
    """Removing the hooks puts the ``torch.distributed`` functions back (a root call that
    raised before its forward hook ran would otherwise leave them wrapped)."""

    def __init__(self, patch: CollectivePatch) -> None:
        self.patch = patch

    def remove(self) -> None:
        self.patch.restore()


def _make_writer(
    model: torch.nn.Module, config: DumpConfig, device: torch.device, ranks: RankInfo | None
) -> WriterThread:
    label = device_label(device)
    pid = os.getpid()
    meta = {
        "pid": pid,
        "device": label,
        "model": type(model).__name__,
        "torch": torch.__version__,
        "argv": list(sys.argv),
        **(ranks.describe() if ranks is not None else {}),
    }
    from . import writer_process

    if writer_process.wanted(config, device.type) and ranks is None:
        run_dir = config.path / fmt.rank_dir_name(label, pid)
        return writer_process.ProcessWriter(config, run_dir, build_topology(model), meta)
    if config.format == "msit":
        from .msit_writer import MsitWriter, msit_run_dir

        return MsitWriter(config, msit_run_dir(config.path, label, pid), model)
    from .writer import LayerwatchWriter

    # One directory per rank of a tensor-parallel job (its number, not its pid, says which).
    name = ranks.dir_name if ranks is not None else fmt.rank_dir_name(label, pid)
    run_dir = config.path / name
    return LayerwatchWriter(config, run_dir, build_topology(model), meta)


def _queue_weights(model: torch.nn.Module, config: DumpConfig, writer: WriterThread) -> None:
    """Queue every selected module's direct parameters once (no copy: weights are not mutated)."""
    for name, module in named_nodes(model):
        if not config.selects(name, module):
            continue
        for local, param in module.named_parameters(recurse=False):
            item = WeightItem(name, local, param.detach().contiguous())
            writer.queue.put([item], item.nbytes)


def _close_all() -> None:
    for handle in list(_OPEN):
        try:
            handle.close()
        except Exception as exc:  # exit anyway; say why the dump may be incomplete
            print(f"layerwatch: could not finish the dump: {exc}", file=sys.stderr)


def _forget_in_child() -> None:
    """A forked child has no writer thread: make its copies of the hooks inert."""
    for handle in list(_OPEN):
        if handle._recorder is not None:
            handle._recorder.stop()
        if handle._writer is not None:
            handle._writer.queue.drain()
            handle._writer._closed = True
            handle._writer.forget()
    _OPEN.clear()
    warm = sys.modules.get(f"{__package__}.writer_process")
    if warm is not None:  # a writer process started ahead and not taken yet
        warm.forget_warm()
    heap.forget()  # the child keeps the frozen heap (no copy-on-write of it) as its own


atexit.register(_close_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)

__all__ = ["HookHandle", "model_device", "register_hook"]
