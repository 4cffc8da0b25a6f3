"""The default writer: the layerwatch format (``capture/format.py``), built for speed and safety.

Per batch (the items of one token, or ``batch_bytes``, or ``flush_interval`` seconds' worth):

1. statistics of every new tensor, batched on its device (``capture/stats.py``);
2. the payloads go into ONE safetensors file that we write ourselves (8-byte little-endian
   header length, JSON header, raw C-contiguous bytes, no gaps), so the absolute byte offsets
   of each payload are known: index lines carry them and readers ``np.fromfile`` them;
   the file is written as ``data/.tmp-NNNNNNNN.safetensors`` and renamed into place;
3. then the batch's index lines are appended with a single ``write()``.

A short write (disk full, file size limit) is undone: the temp file is removed and the index
is truncated back to its last complete line, so readers never see half a record.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import format as fmt
from .config import DumpConfig
from .errors import LayerwatchError
from .handoff import Placeholder, TensorItem, TokenItem, TopologyItem, WeightItem
from .stats import batch_stats
from .topology import with_order
from .writer_thread import WriterThread

SAFETENSORS_DTYPE = {
    torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}
for _name, _code in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2"), ("uint16", "U16"),
                     ("uint32", "U32"), ("uint64", "U64")):
    if hasattr(torch, _name):
        SAFETENSORS_DTYPE[getattr(torch, _name)] = _code


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


DTYPE_NAMES = {dt: dtype_name(dt) for dt in SAFETENSORS_DTYPE}


def payload_view(data: Any) -> Any:
    """The raw bytes of a captured copy (numpy array, or a contiguous tensor on any device)."""
    if isinstance(data, np.ndarray):
        return data
    if data.device.type != "cpu":
        data = data.cpu()
    return data.reshape(-1).view(torch.uint8).numpy()


class LayerwatchWriter(WriterThread):
    """Writes ``{dump_path}/{device}_{pid}/`` in the layerwatch format."""

    def __init__(self, config: DumpConfig, run_dir: Path, topology: dict[str, Any], meta: dict[str, Any]) -> None:
        super().__init__(config, run_dir)
        self.topology = topology
        self.meta = meta
        self.seq = 0
        self.deferred: list[TensorItem] = []
        """Aliases whose bytes are not written yet (they arrive with an outer module's inputs)."""
        self.want_stats = config.want_stats
        self.want_payload = config.want_payload
        self.started = time.time()
        try:
            if (run_dir / fmt.MANIFEST).exists():
                raise LayerwatchError(
                    f"{run_dir} already holds a dump of this process: give each model its own dump_path")
            (run_dir / fmt.DATA_DIR).mkdir(parents=True, exist_ok=True)
            write_json_fast(run_dir / fmt.MANIFEST, self.manifest(fmt.STATUS_RUNNING))
            write_json_fast(run_dir / fmt.TOPOLOGY, topology)
            self.index_fd = os.open(run_dir / fmt.INDEX, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise LayerwatchError(f"cannot write a dump in {run_dir}: {exc.strerror or exc}") from None
        self.index_size = os.fstat(self.index_fd).st_size

    def manifest(self, status: str) -> dict[str, Any]:
        return {
            "format": fmt.FORMAT_NAME, "version": fmt.FORMAT_VERSION, "status": status,
            "started": self.started, "updated": time.time(), "tokens": self.tokens_seen,
            "tensors": self.tensors_written, "bytes": self.bytes_written,
            **self.meta, "config": self.config.describe(),
        }

    # --- a batch --------------------------------------------------------------------------
    def write_items(self, items: list[Any]) -> None:
        start = 0
        size = 0
        for i, item in enumerate(items):  # cut into files of about batch_bytes
            size += item.nbytes
            if size >= self.config.batch_bytes:
                self._write_chunk(items[start:i + 1])
                start, size = i + 1, 0
        if start < len(items):
            self._write_chunk(items[start:])

    def _write_chunk(self, items: list[Any]) -> None:
        fresh = [it for it in items if type(it) is TensorItem and it.alias is None]
        ok = []
        for it in fresh:
            data = it.tensor
            it.dtype_name = DTYPE_NAMES.get(it.dtype) or dtype_name(it.dtype)
            it.shape = list(data.shape)
            if isinstance(data, np.ndarray) or (type(data) is not Placeholder and _plain_tensor(data)):
                ok.append(it)
        if self.want_stats and ok:
            rows = batch_stats([it.tensor for it in ok], [it.dtype for it in ok])
            for it, row in zip(ok, rows, strict=True):
                it.stats = row
        payload: list[Any] = [it for it in items if type(it) is WeightItem]
        if self.want_payload:
            payload += [it for it in ok if it.dtype in SAFETENSORS_DTYPE]
        if payload:
            self._write_data_file(payload)
        for it in fresh:
            it.done = True
        lines: list[str] = []
        if self.deferred:
            ready = [d for d in self.deferred if d.alias.done]
            self.deferred = [d for d in self.deferred if not d.alias.done]
            lines.extend(_tensor_line(d) for d in ready)
        for it in items:
            kind = type(it)
            if kind is TensorItem:
                if it.alias is None or it.alias.done:
                    lines.append(_tensor_line(it))
                else:  # its bytes come with an outer module's inputs, queued later
                    self.deferred.append(it)
            elif kind is TokenItem:
                if self.deferred:  # a target that never came (its module raised): drop
                    self.deferred = [d for d in self.deferred if d.token >= it.token]
                ids = None if it.ids is None else it.ids.reshape(-1).tolist()
                lines.append(fmt.encode_line({"k": fmt.K_TOKEN, "token": it.token, "input_ids": ids}))
                self.tokens_seen = max(self.tokens_seen, it.token + 1)
            elif kind is WeightItem:
                lines.append(fmt.encode_line({
                    "k": fmt.K_WEIGHT, "name": f"{it.node}.{it.param}", "node": it.node, "param": it.param,
                    "dtype": dtype_name(it.tensor.dtype), "shape": list(it.tensor.shape),
                    "file": it.file, "begin": it.begin, "end": it.end}))
            elif kind is TopologyItem:
                self.topology = with_order(self.topology, it.order)
        self.tensors_written += len(fresh)
        self.append_index("".join(lines))
        if any(type(it) is TopologyItem for it in items):  # after the lines: they matter more
            write_json_fast(self.run_dir / fmt.TOPOLOGY, self.topology)

    def _write_data_file(self, payload: list[Any]) -> None:
        header: dict[str, Any] = {}
        offset = 0
        for it in payload:
            t = it.tensor
            name = (f"weights/{it.node}.{it.param}" if type(it) is WeightItem
                    else fmt.tensor_name(it.token, it.node, it.stem))
            dtype = t.dtype if type(it) is WeightItem else it.dtype
            header[name] = {"dtype": SAFETENSORS_DTYPE[dtype], "shape": list(t.shape),
                            "data_offsets": [offset, offset + it.nbytes]}
            it.begin = offset
            offset += it.nbytes
        header["__metadata__"] = {"format": "pt", "writer": "layerwatch"}
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        base = 8 + len(raw)
        rel = fmt.data_file_name(self.seq)
        self.seq += 1
        path = self.run_dir / rel
        tmp = path.with_name(fmt.TMP_PREFIX + path.name)
        try:
            buffers = [struct.pack("<Q", len(raw)) + raw]
            buffers += [payload_view(it.tensor) for it in payload]
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                _writev_all(fd, buffers, str(tmp))
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(exc, OSError) and exc.filename is None:
                exc.filename = str(path)
            raise
        for it in payload:
            it.file = rel
            it.begin += base
            it.end = it.begin + it.nbytes
        self.bytes_written += base + offset

    def append_index(self, text: str) -> None:
        """Append complete lines with one write; undo a short write so no half line stays."""
        data = text.encode()
        if not data:
            return
        try:
            written = os.write(self.index_fd, data)
            if written != len(data):
                raise OSError(27, "File too large", str(self.run_dir / fmt.INDEX))
        except OSError as exc:
            os.ftruncate(self.index_fd, self.index_size)
            if exc.filename is None:
                exc.filename = str(self.run_dir / fmt.INDEX)
            raise
        self.index_size += written

    # --- ends -----------------------------------------------------------------------------
    def finish(self, status: str) -> None:
        if self.failed is None:
            self.append_index(fmt.encode_line({
                "k": fmt.K_END, "status": status, "tokens": self.tokens_seen,
                "tensors": self.tensors_written}))
            write_json_fast(self.run_dir / fmt.MANIFEST, self.manifest(status))
        os.close(self.index_fd)

    def record_failure(self, message: str) -> None:
        try:
            self.append_index(fmt.encode_line({"k": fmt.K_ERROR, "message": message}))
        finally:
            write_json_fast(self.run_dir / fmt.MANIFEST, self.manifest("error: " + message))


def write_json_fast(path: Path, obj: Any) -> None:
    """Atomic compact JSON (the C encoder; ``indent`` would switch to the slow Python one).

    The temp file is removed if the write fails, so a full disk leaves no ``.tmp-`` behind.
    """
    try:
        text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    except ValueError:  # NaN/Inf (a fingerprint of broken weights): written as strings
        text = fmt.encode_line(obj)
    tmp = path.with_name(fmt.TMP_PREFIX + path.name)
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


_IOV_MAX = 512


def _writev_all(fd: int, buffers: list[Any], name: str) -> None:
    """Write every buffer with as few system calls as possible (``writev``), retrying short writes."""
    views = [memoryview(b).cast("B") for b in buffers]
    views = [v for v in views if v.nbytes]
    while views:
        group = views[:_IOV_MAX]
        n = os.writev(fd, group)
        if n <= 0:
            raise OSError(28, "No space left on device", name)
        while n and views:
            head = views[0]
            if n >= head.nbytes:
                n -= head.nbytes
                views.pop(0)
            else:
                views[0] = head[n:]
                n = 0


def _plain_tensor(data: torch.Tensor) -> bool:
    """A copy we can reduce and write (strided, real, not on the meta device); others are
    indexed with dtype and shape only (complex rotary tables, sparse masks...)."""
    return data.layout is torch.strided and data.device.type != "meta" and not data.is_complex()


_HEADS: dict[tuple[str, str, str], str] = {}


def _num(x: float) -> str:
    return repr(x) if math.isfinite(x) else f'"{x!r}"'


def _tensor_line(it: TensorItem) -> str:
    """One ``K_TENSOR`` line (the same JSON as ``IndexTensor.to_json``), formatted directly."""
    src = it.alias if it.alias is not None else it
    key = (it.node, it.stem, it.node_type)
    head = _HEADS.get(key)
    if head is None:
        head = _HEADS[key] = (f'"node":{json.dumps(it.node)},"stem":{json.dumps(it.stem)},'
                              f'"type":{json.dumps(it.node_type)}')
    tail = src.tail
    if tail is None:  # the part every alias of this tensor shares: computed once
        st = src.stats
        if st is None:
            stats = "null"
        else:
            mx, mn, mean, norm, nan, inf = st
            stats = (f'{{"max":{_num(mx)},"min":{_num(mn)},"mean":{_num(mean)},'
                     f'"norm":{_num(norm)},"nan":{nan},"inf":{inf}}}')
        shape = ",".join(map(str, src.shape))
        tail = src.tail = (f'"dtype":"{src.dtype_name}","shape":[{shape}],"file":"{src.file}",'
                           f'"begin":{src.begin},"end":{src.end},"stats":{stats}}}\n')
    return f'{{"k":"t","token":{it.token},{head},"order":{it.order},{tail}'
