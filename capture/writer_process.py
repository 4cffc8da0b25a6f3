"""The layerwatch writer in a process of its own, off the model's GIL (ARCHITECTURE.md, "Threads").

On the small-tensor path (a long generation of a small model: ~150 tensors a token) the
writer's Python (statistics, data files, index lines: ~0.35 s of a 512-token run) ran under the
model's GIL, so it cost the model its whole CPU time. Here the model process keeps the queue and
its thread (:class:`ProcessWriter`, the same loop, back-pressure and failure policy as
``capture/writer_thread.py``), but that thread only packs each batch: a compact record per item
(pickled builtins) and the payloads' bytes, sent through a pipe to a writer process started with
``subprocess`` (exec, never fork: torch is loaded) that imports numpy and the writer, never torch.
It rebuilds the items and runs :class:`~layerwatch.capture.writer.LayerwatchWriter` on them, so
the dump is the same bytes, written the same way (atomic data files, one index append a batch).

Contracts kept:

* the queue's bytes are released when the writer process says a batch is on disk, so the
  model still waits when ``queue_bytes`` are outstanding, and ``flush``/``close`` return only
  when everything is written;
* a write failure in the writer process is the same one line (it records it in the dump; the
  model process prints it and turns the hooks off); the writer process dying is one line too,
  recorded in the dump by the model process, and nothing already written is undone;
* the model process dying (killed) closes the pipe: the writer process writes what it
  received and exits, never waits;
* where the process cannot start, cannot import this installation or ends before the
  hand-over, the model process's thread goes on writing the batches itself
  (:class:`LayerwatchWriter`, nothing lost: the process writes nothing before the hand-over).

The default for host (CPU) models in the layerwatch format without ``dump_weight`` (device
tensors are reduced on the device, weights and the msit format keep the thread writer), on
two cores or more (loaded or not: capture/cpus.py ``second_core``), but only for runs that
show they are long. The process takes ~0.2 s to start (more under load),
which a long run earns back and a short one does not (``bench_dump.py`` config b, 8 tokens,
when every run started it: 1.9x -> 3.3-4.4x). So the thread writes the first batches itself;
after :attr:`ProcessWriter.spawn_after` items it starts the process, keeps writing while the
process imports, and at the first batch after the process says it is up it hands over: the
run's :class:`LayerwatchWriter` state (next data file, counters, topology, statistics-first
ring, aliases still waiting for their source) crosses once, and the process continues the same
dump, byte for byte. A run that closes before the hand-over kills the process (it has written
nothing) and never waits for it. ``layerwatch dump``'s processes start one ahead, when torch is
imported (:func:`prestart`): the first capture takes it over at its first batch.
``LAYERWATCH_WRITER=thread`` keeps the thread writer; ``LAYERWATCH_WRITER=process`` starts the
process with the run and hands over before the first batch (waiting for it), as the tests use
it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
import signal
import struct
import subprocess
import sys
from pathlib import Path
from typing import IO, Any, cast

import numpy as np

from .config import DumpConfig
from .cpus import second_core
from .handoff import LineItem, Placeholder, TensorItem, TokenItem, TopologyItem
from .index_lines import tail_text
from .keep import TokenRing
from .safetensors_file import _writev_all, joined
from .stats import SMALL, batch_stats
from .writer import LayerwatchWriter
from .writer_thread import FAILURE_TAIL, describe_failure

ENV = "LAYERWATCH_WRITER"
"""``thread``: never a writer process; ``process``: one from the run's start, where the capture
allows it; anything else: the thread, then a writer process after the hand-over."""
_FRAME = struct.Struct("<cQQ")
"""Kind (``I``nit: the hand-over, ``B``atch, ``S``top), bytes of the records, bytes of payload."""
_PIPE_BYTES = 1 << 20
_FRESH, _ALIAS, _TOKEN, _LINE, _TOPOLOGY, _TENSOR, _WRITTEN = range(7)
"""Record kinds: a fresh copy, an alias of one, a token, an index line, the order, a fresh
copy that was a torch tensor (a dtype numpy cannot hold: reduced with torch there), and an
alias of a copy this process wrote before the hand-over (its line's tail crosses)."""
_CHILD = (
    "import sys\n"
    "try:\n"
    "    from layerwatch.capture import writer_process\n"
    "except ImportError:\n"
    "    sys.exit(3)\n"
    "writer_process.child_main(sys.argv[1])\n"
)


def wanted(config: DumpConfig, device_type: str) -> bool:
    """Whether this capture may write through a writer process (see the module docstring)."""
    return (
        os.environ.get(ENV, "") != "thread"
        and config.format == "layerwatch"
        and not config.dump_weight
        and device_type == "cpu"
    )


_WARM: list[subprocess.Popen[bytes]] = []
"""A writer process started ahead by :func:`prestart`, for this process's first capture."""


def prestart(config: DumpConfig) -> None:
    """Start a writer process now, for the first host capture of this process to take over at
    its first batch instead of writing ~10 k items under the model's GIL while one imports.

    ``layerwatch dump``'s processes call it when ``import torch`` completes
    (``capture/autohook.py``): the process imports numpy (~0.2 s of CPU) while the program
    imports the rest and builds its model, and ``layerwatch dump`` times whole runs, where a
    short run does not notice it. A process nobody takes (a device model, the msit format)
    waits on its pipe and ends with this one, which holds the only copy of its ends."""
    if _WARM or not wanted(config, "cpu") or not second_core():
        return
    with contextlib.suppress(OSError, ValueError):
        _WARM.append(_popen())


def _popen() -> subprocess.Popen[bytes]:
    """A writer process (``child_main``), its answers on its stdout."""
    from .launch import ENV_SETTINGS

    env = dict(os.environ)
    env.pop(ENV_SETTINGS, None)  # never capture the writer, should it ever import torch
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, here],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,  # a Ctrl-C meant for the model does not cut a batch short
    )
    with contextlib.suppress(OSError, AttributeError):  # Linux: fewer wake-ups a batch
        import fcntl

        fcntl.fcntl(proc.stdin.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_BYTES)  # type: ignore[union-attr]
    return proc


def forget_warm() -> None:
    """In a forked child: close its copies of the started process's pipe ends, so that the
    process still sees this one end (``capture/hooks.py``'s fork handler)."""
    while _WARM:
        proc = _WARM.pop()
        for pipe in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()


class ProcessWriter(LayerwatchWriter):
    """The model process's side: sets the run up as the thread writer does, writes the first
    batches itself, then hands the run over to the writer process and sends it the batches.

    Its own :class:`LayerwatchWriter` state stays ready: until the hand-over, and for good if
    the writer process does not come up (:attr:`local`), this thread writes the batches.
    """

    spawn_after = 4096
    """Items (tensors, aliases, tokens) written here before the writer process is started:
    ~26 tokens of a 4-layer Llama (156 a token), 3x ``bench_dump.py`` config b's 9 tokens."""
    wait_for_start = False
    """Block at the hand-over point until the process is up, whatever the box's load (no
    spare-core check): tests place the hand-over with it."""

    def __init__(
        self, config: DumpConfig, run_dir: Path, topology: dict[str, Any], meta: dict[str, Any]
    ) -> None:
        super().__init__(config, run_dir, topology, meta)
        self.local = False
        """The batches are written in this process for the rest of the run: the writer
        process could not start, or this process runs on one core (capture/cpus.py)."""
        self.remote = False
        """The run was handed over: the writer process writes every batch from now on."""
        self.forced = os.environ.get(ENV, "") == "process"
        """``LAYERWATCH_WRITER=process``: started with the run, handed over at once."""
        self.items_here = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._acks: IO[bytes] | None = None
        self._up = False
        self._by_seq: dict[int, TensorItem] = {}
        """This token's items made here (by the hooks' ``seq``): an alias finds its source."""
        self._token = -1

    takes_records = True

    # --- life cycle -----------------------------------------------------------------------
    def start(self) -> None:
        if _WARM:  # started ahead (prestart): it takes over at the first batch after it is up
            self._spawn(_WARM.pop())
        elif self.forced:
            self._start_process()
        super().start()

    def _start_process(self) -> None:
        try:
            self._spawn()
        except (OSError, ValueError):  # no process
            self._go_local()

    def _spawn(self, proc: subprocess.Popen[bytes] | None = None) -> None:
        """Start the writer process, or take ``proc`` (one started ahead by :func:`prestart`)."""
        self._proc = proc if proc is not None else _popen()
        self._acks = self._proc.stdout

    def _hand_over(self) -> bool:
        """Before a batch: start the process once the run is long, hand the run over once it
        is up. Never waits for the process's start (unless forced); ``True``: it writes."""
        if self.remote:
            return True
        if self.local:
            return False
        if self._proc is None:
            if self.items_here < self.spawn_after:
                return False
            if not (self.wait_for_start or second_core()):  # one core: the process
                self.local = True  # would only add its start and the pipe to the model's work
                return False
            self._start_process()
            if self.local:
                return False
        if not self._up:
            if not (self.forced or self.wait_for_start or self._answered()):
                return False  # still importing: this batch is written here
            if self._read_ack() != b"up":  # it could not start or import this installation
                self._go_local()
                return False
            self._up = True
        deferred = self._pack_deferred()
        init = {
            "run_dir": str(self.run_dir),
            "topology": self.topology,
            "meta": self.meta,
            "started": self.started,
            "settings": dataclasses.asdict(Settings.of(self.config)),
            "state": {
                "seq": self.seq,
                "tokens": self.tokens_seen,
                "tensors": self.tensors_written,
                "bytes": self.bytes_written,
                "ring": None if self.ring is None else self.ring.state(),
            },
        }
        try:
            # JSON, not pickle: meta's torch version is a torch class (a str to JSON), and all
            # of it is written as JSON over there anyway
            self._send(b"I", pickle.dumps((json.dumps(init), deferred), protocol=5), [])
        except (OSError, ValueError, TypeError):  # gone, or a topology JSON cannot hold
            self._go_local()
            return False
        if self._read_ack() != b"ready":  # it wrote nothing yet: this thread goes on
            self._go_local()
            return False
        self.remote = True
        self.deferred = []
        return True

    def _answered(self) -> bool:
        """Whether the writer process said something (or ended), without waiting."""
        import select

        if self._acks is None:
            return True
        try:
            return bool(select.select([self._acks.fileno()], [], [], 0)[0])
        except (OSError, ValueError):
            return True  # then reading says it is gone

    def _go_local(self) -> None:
        self.local = True
        self._drop_process()

    def _drop_process(self) -> None:
        """Kill the writer process before it wrote anything (no hand-over), and reap it."""
        if self._proc is not None:
            with contextlib.suppress(OSError):
                self._proc.kill()
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                self._proc.wait(5)
            self._close_pipes()

    def _close_pipes(self) -> None:
        proc = self._proc
        if proc is not None:
            for pipe in (proc.stdin, proc.stdout):
                with contextlib.suppress(OSError):
                    if pipe is not None:
                        pipe.close()

    # --- batches --------------------------------------------------------------------------
    def write_items(self, items: list[Any]) -> None:
        if not self._hand_over():
            made = self._items(items)
            self.items_here += len(made)
            try:
                super().write_items(made)
            finally:
                for it in made:  # the loop only sees the groups: drop the copies now
                    if type(it) is TensorItem:
                        it.tensor = None
                _drop_copies(items)
            return
        records, payload = self._pack(items)
        _drop_copies(items)
        try:
            self._send(b"B", pickle.dumps(records, protocol=5), payload)
        except BrokenPipeError:  # it is gone: say how it ended, not "broken pipe"
            self._gone()
            return
        self._expect_ok()

    def _items(self, entries: list[Any]) -> list[Any]:
        """Items of the hooks' groups, for the batches this thread writes: an alias points
        at its source's item, made empty first if the source comes later (an outer module's
        input) and filled when it comes, as the writer process's :class:`_Rebuilder` does."""
        out: list[Any] = []
        add = out.append
        by_seq = self._by_seq
        for entry in entries:
            if type(entry) is not tuple:
                add(entry)
                continue
            order, recs = entry
            for token, node, stem, type_, data, name, seq, _ in recs:
                if token != self._token:  # aliases never reach back past their token
                    self._token = token
                    by_seq.clear()
                if data is None:
                    src = by_seq.get(seq)
                    if src is None:
                        src = by_seq[seq] = TensorItem(token, node, stem, None, type_)
                        src.seq = seq
                    it = TensorItem(token, node, stem, None, type_, src)
                else:
                    it = by_seq.get(seq)  # type: ignore[assignment]
                    if it is None:
                        it = by_seq[seq] = TensorItem(token, node, stem, data, type_, None, name)
                    else:  # an alias came first: fill the item it points at
                        it.__init__(token, node, stem, data, type_, None, name)  # type: ignore[misc]
                    it.seq = seq
                it.order = order
                add(it)
        return out

    def _pack_deferred(self) -> list[Any]:
        """Records of the aliases this thread holds back (their source comes later): the
        process holds them back in turn, the source filling them when it comes."""
        records: list[Any] = []
        for it in self.deferred:
            src = it.alias
            assert src is not None  # only aliases are deferred
            records.append((_ALIAS, it.token, it.node, it.stem, it.node_type, it.order, src.seq))
        return records

    def _pack(self, items: list[Any]) -> tuple[list[Any], list[Any]]:
        """Records of the hooks' groups and other items (builtins and numpy dtypes only) and
        their payloads in order."""
        records: list[Any] = []
        payload: list[Any] = []
        add = records.append
        ndarray = np.ndarray
        large: list[tuple[int, np.ndarray]] = []
        here = self._by_seq  # items this thread wrote before the hand-over, this token
        for entry in items:
            kind = type(entry)
            if kind is tuple:
                order, recs = entry
                for token, node, stem, type_, data, name, seq, _ in recs:
                    if data is None:
                        src = here.get(seq) if here and token == self._token else None
                        if src is not None and src.done:  # written by this thread
                            tail = src.tail or tail_text(src)
                            add((_WRITTEN, token, node, stem, type_, order, tail))
                        else:  # its source is here, or still in an outer module's frame
                            add((_ALIAS, token, node, stem, type_, order, seq))
                    elif type(data) is ndarray:
                        size = data.size
                        if size >= SMALL:
                            large.append((len(records), data))
                        add(
                            (_FRESH, token, node, stem, type_, order, seq,
                             name, data.dtype, data.shape, size, None)
                        )  # fmt: skip
                        payload.append(data)
                    else:
                        head = (token, node, stem, type_, order, seq, name)
                        add(self._odd(head, data, payload))
            elif kind is TokenItem:
                ids = None if entry.ids is None else entry.ids.numpy()
                add((_TOKEN, entry.token, ids))
            elif kind is LineItem:
                add((_LINE, entry.obj))
            elif kind is TopologyItem:
                add((_TOPOLOGY, entry.order))
            else:
                raise TypeError(f"the writer process cannot write a {kind.__name__}")
        if large and self.want_stats:
            # Reduced here, where torch is loaded, with the kernels the thread writer uses for
            # them (stats.py reduces each large array alone): the process stays torch-free.
            # Small ones stay there: their statistics depend on the batch they are reduced in.
            rows = batch_stats([d for _, d in large], [records[i][7] for i, _ in large])
            for (i, _), row in zip(large, rows, strict=True):
                records[i] = (*records[i][:-1], row)
        return records, payload

    @staticmethod
    def _odd(head: tuple[Any, ...], data: Any, payload: list[Any]) -> tuple[Any, ...]:
        """A fresh copy that is no numpy array: a :class:`Placeholder`, or a host tensor whose
        dtype numpy cannot hold (sent as its bytes; rebuilt as a tensor over there). ``head``:
        token, node, stem, node type, order, seq, dtype name."""
        if type(data) is Placeholder or data.is_complex() or data.device.type != "cpu":
            return (_FRESH, *head, None, tuple(data.shape), 0, None)
        import torch

        raw = data.reshape(-1).view(torch.uint8).numpy()
        payload.append(raw)
        return (_TENSOR, *head, raw.dtype, tuple(data.shape), raw.size, None)

    def _send(self, kind: bytes, meta: bytes, payload: list[Any]) -> None:
        size = sum(p.nbytes for p in payload)
        stdin = self._proc.stdin  # type: ignore[union-attr]
        _writev_all(
            stdin.fileno(),  # type: ignore[union-attr]
            [_FRAME.pack(kind, len(meta), size) + meta, *joined(payload)],
            "the writer process",
        )

    def _read_ack(self) -> bytes:
        try:
            return self._acks.readline().strip() if self._acks is not None else b""
        except (OSError, ValueError):
            return b""

    def _expect_ok(self) -> None:
        """Wait for the batch's answer: ``ok`` with the counts, or the failure line."""
        line = self._read_ack()
        head, _, rest = line.partition(b" ")
        if head == b"ok":
            tokens, tensors, nbytes = rest.split()
            self.tokens_seen, self.tensors_written = int(tokens), int(tensors)
            self.bytes_written = int(nbytes)
        elif head == b"failed":
            self.stop_capture(rest.decode("utf-8", "replace"))
        else:
            self._gone()

    def _gone(self) -> None:
        """The writer process ended mid-run: one line, recorded here (after what it wrote)."""
        self.stop_capture(f"capture stopped: {self._exit_text()} ({FAILURE_TAIL})")

    def _exit_text(self) -> str:
        proc = self._proc
        code = None
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = proc.wait(2)
        if code is None:
            return "the writer process stopped answering"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"the writer process was killed ({signal.Signals(-code).name})"
        return f"the writer process exited (status {code})"

    # --- ends -----------------------------------------------------------------------------
    def finish(self, status: str) -> None:
        if not self.remote:  # a short run: the process (if started) wrote nothing, end it
            self._drop_process()
            super().finish(status)
            return
        try:
            self._send(b"S", pickle.dumps(self.failed), [])
            line = self._read_ack()
        except BrokenPipeError:
            line = b""
        try:
            head, _, rest = line.partition(b" ")
            if head == b"done":
                tokens, tensors, nbytes = rest.split()
                self.tokens_seen, self.tensors_written = int(tokens), int(tensors)
                self.bytes_written = int(nbytes)
            else:
                self._gone()
        finally:
            self._close_pipes()
            if self._proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(30)
            os.close(self.index_fd)

    def record_failure(self, message: str) -> None:
        if not self.remote or self._proc is None or self._proc.poll() is not None:
            # not handed over, or the writer process is gone: append after whatever it
            # wrote, never truncate it
            self.index_size = os.fstat(self.index_fd).st_size
            super().record_failure(message)
        # else the writer process records it: its own failure, or this one at the stop

    def forget(self) -> None:
        """A forked child holds copies of the pipes: close them, so that the writer process
        still sees the model process end (``capture/hooks.py``'s fork handler)."""
        self._close_pipes()


def _drop_copies(entries: list[Any]) -> None:
    """Let go of the copies in the hooks' groups once a batch is written or sent."""
    for entry in entries:
        if type(entry) is tuple:
            entry[1].clear()


def _as_tensor(raw: np.ndarray, name: str, shape: tuple[int, ...]) -> Any:
    """A host tensor again from its bytes (dtypes numpy cannot hold: imports torch, rarely)."""
    import torch

    return torch.from_numpy(raw).view(getattr(torch, name)).reshape(shape)


@dataclasses.dataclass
class Settings:
    """What the writer process needs of a :class:`DumpConfig` (which holds module types, so
    torch, and cannot cross): the switches the writer reads and the manifest's summary."""

    queue_bytes: int
    batch_bytes: int
    want_stats: bool
    want_payload: bool
    keep_tokens: int | None
    summary: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, config: DumpConfig) -> Settings:
        return cls(
            config.queue_bytes,
            config.batch_bytes,
            config.want_stats,
            config.want_payload,
            config.keep_tokens,
            config.describe(),
        )

    def describe(self) -> dict[str, Any]:
        return self.summary


# --- the writer process ---------------------------------------------------------------------
def child_main(expected_dir: str) -> None:
    """Entry of the writer process: ``ready``, then one answer per frame until ``S`` or EOF."""
    if os.path.dirname(os.path.abspath(__file__)) != expected_dir:
        sys.exit(3)  # another installation's layerwatch: the model process writes itself
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    acks = os.dup(1)  # answers only: stray output of imported code goes to /dev/null
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    inbox = os.fdopen(0, "rb", buffering=0)
    _answer(acks, b"up")
    frame = _read_frame(inbox)  # the hand-over, whenever the model process's thread is ready
    if frame is None or frame[0] != b"I":
        return
    text, deferred = pickle.loads(frame[1])
    init = json.loads(text)
    writer = LayerwatchWriter(
        cast(DumpConfig, Settings(**init["settings"])),
        Path(init["run_dir"]),
        init["topology"],
        init["meta"],
        started=init["started"],
    )
    state = init["state"]
    writer.seq = state["seq"]
    writer.tokens_seen, writer.tensors_written = state["tokens"], state["tensors"]
    writer.bytes_written = state["bytes"]
    if state["ring"] is not None:
        writer.ring = TokenRing.of_state(state["ring"])
    rebuild = _Rebuilder()
    writer.deferred = rebuild.items(deferred, bytearray())
    _answer(acks, b"ready")
    while True:
        frame = _read_frame(inbox)
        if frame is None:  # the model process is gone: what came is written, stop here
            return
        kind, meta, payload = frame
        if kind == b"S":
            failed = pickle.loads(meta)
            if failed is not None and writer.failed is None:  # the model process's own failure
                writer.failed = failed
                with contextlib.suppress(Exception):
                    writer.record_failure(failed)
            with contextlib.suppress(Exception):
                writer.finish(writer.failed or "complete")
            _answer(acks, b"done " + _counts(writer))
            return
        items: list[Any] = []
        if writer.failed is None:
            try:
                items = rebuild.items(pickle.loads(meta), payload)
                writer.write_items(items)
            except Exception as exc:
                where = getattr(exc, "filename", None) or writer.run_dir
                writer.failed = describe_failure(exc, where)
                with contextlib.suppress(Exception):
                    writer.record_failure(writer.failed)
                _answer(acks, b"failed " + writer.failed.encode())
                continue
        for it in items:  # drop the views of this batch's buffer
            if type(it) is TensorItem:
                it.tensor = None
        _answer(acks, b"ok " + _counts(writer))


def _counts(writer: LayerwatchWriter) -> bytes:
    return f"{writer.tokens_seen} {writer.tensors_written} {writer.bytes_written}".encode()


def _answer(fd: int, line: bytes) -> None:
    try:
        os.write(fd, line + b"\n")
    except OSError:  # the model process is gone
        sys.exit(0)


def _read_frame(inbox: Any) -> tuple[bytes, bytes, bytearray] | None:
    head = _read_exact(inbox, _FRAME.size)
    if head is None:
        return None
    kind, nmeta, npayload = _FRAME.unpack(head)
    meta = _read_exact(inbox, nmeta)
    payload = _read_exact(inbox, npayload)
    if meta is None or payload is None:
        return None
    return kind, bytes(meta), payload


def _read_exact(inbox: Any, n: int) -> bytearray | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = inbox.readinto(view[got:])
        if not k:
            return None
        got += k
    return buf


class _Rebuilder:
    """Items again from records: fresh copies as numpy views of the batch's payload buffer,
    aliases pointing at their source (which may come in a later batch of the same token)."""

    def __init__(self) -> None:
        self.by_seq: dict[int, TensorItem] = {}
        self.token = -1

    def items(self, records: list[Any], payload: bytearray) -> list[Any]:
        out: list[Any] = []
        add = out.append
        by_seq = self.by_seq
        offset = 0
        for rec in records:
            kind = rec[0]
            if kind in (_FRESH, _TENSOR):
                _, token, node, stem, node_type, order, seq, name, npdtype, shape, count, row = rec
                if token != self.token:  # aliases never reach back past their token
                    self.token = token
                    by_seq.clear()
                if npdtype is None:
                    data: Any = Placeholder(shape, name)
                elif kind == _FRESH:  # one constructor, not frombuffer + reshape (0.6 vs 1.4 us)
                    data = np.ndarray(shape, npdtype, payload, offset)
                    offset += data.nbytes
                else:
                    data = np.frombuffer(payload, npdtype, count, offset)
                    offset += data.nbytes
                    data = _as_tensor(data, name, shape)
                it = by_seq.get(seq)
                if it is None:
                    it = by_seq[seq] = TensorItem(token, node, stem, data, node_type, None, name)
                else:  # an alias came first: fill the object it points at
                    it.__init__(token, node, stem, data, node_type, None, name)  # type: ignore[misc]
                it.order = order
                if row is not None:  # reduced in the model process (a large array)
                    it.stats = row
                add(it)
            elif kind == _ALIAS:
                _, token, node, stem, node_type, order, seq = rec
                if token != self.token:
                    self.token = token
                    by_seq.clear()
                src = by_seq.get(seq)
                if src is None:
                    src = by_seq[seq] = TensorItem(token, node, stem, None, node_type)
                it = TensorItem(token, node, stem, None, node_type, src)
                it.order = order
                add(it)
            elif kind == _WRITTEN:
                _, token, node, stem, node_type, order, tail = rec
                src = TensorItem(token, node, stem, None, node_type)
                src.done, src.tail = True, tail
                it = TensorItem(token, node, stem, None, node_type, src)
                it.order = order
                add(it)
            elif kind == _TOKEN:
                token_item = TokenItem(rec[1], None)
                token_item.ids = rec[2]  # a numpy array: the writer only lists it
                add(token_item)
            elif kind == _LINE:
                add(LineItem(rec[1]))
            elif kind == _TOPOLOGY:
                add(TopologyItem(rec[1]))
        return out
