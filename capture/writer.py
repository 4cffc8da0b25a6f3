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

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from . import format as fmt
from . import keep
from .config import DumpConfig
from .errors import LayerwatchError
from .handoff import LineItem, Placeholder, TensorItem, TokenItem, TopologyItem, WeightItem
from .index_lines import HEADS, head_text, shape_text, tail_text, tensor_line
from .safetensors_file import (
    DTYPE_NAMES,
    SAFETENSORS_DTYPE,
    dtype_name,
    payload_view,
    quote,
    tensor_entry,
    write_batch_parts,
    write_json_fast,
)
from .stats import batch_stats
from .topology import with_order
from .writer_thread import WriterThread


class LayerwatchWriter(WriterThread):
    """Writes ``{dump_path}/{device}_{pid}/`` in the layerwatch format."""

    def __init__(
        self,
        config: DumpConfig,
        run_dir: Path,
        topology: dict[str, Any],
        meta: dict[str, Any],
        started: float | None = None,
    ) -> None:
        """``started``: continue the run that the model process set up at that time (the
        writer process, ``capture/writer_process.py``): no manifest check, no first files."""
        super().__init__(config, run_dir)
        self.topology = topology
        self.meta = meta
        self.seq = 0
        self.deferred: list[TensorItem] = []
        """Aliases whose bytes are not written yet (they arrive with an outer module's inputs)."""
        self.want_stats = config.want_stats
        self.want_payload = config.want_payload
        self.started = time.time() if started is None else started
        self.ring = None if config.keep_tokens is None else keep.TokenRing(config.keep_tokens)
        """Statistics-first capture: which data files may be deleted (``capture/keep.py``)."""
        try:
            if started is None:
                if (run_dir / fmt.MANIFEST).exists():
                    raise LayerwatchError(
                        f"{run_dir} already holds a dump of this process: "
                        "give each model its own dump_path"
                    )
                (run_dir / fmt.DATA_DIR).mkdir(parents=True, exist_ok=True)
                write_json_fast(run_dir / fmt.MANIFEST, self.manifest(fmt.STATUS_RUNNING))
                write_json_fast(run_dir / fmt.TOPOLOGY, topology)
            self.index_fd = os.open(
                run_dir / fmt.INDEX, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
            )
        except OSError as exc:
            raise LayerwatchError(
                f"cannot write a dump in {run_dir}: {exc.strerror or exc}"
            ) from None
        self.index_size = os.fstat(self.index_fd).st_size

    def manifest(self, status: str) -> dict[str, Any]:
        return {
            "format": fmt.FORMAT_NAME,
            "version": fmt.FORMAT_VERSION,
            "status": status,
            "started": self.started,
            "updated": time.time(),
            "tokens": self.tokens_seen,
            "tensors": self.tensors_written,
            "bytes": self.bytes_written,
            **self.meta,
            "config": self.config.describe(),
        }

    # --- a batch --------------------------------------------------------------------------
    def write_items(self, items: list[Any]) -> None:
        start = 0
        size = 0
        for i, item in enumerate(items):  # cut into files of about batch_bytes
            size += item.nbytes
            if size >= self.config.batch_bytes:
                self._write_chunk(items[start : i + 1])
                start, size = i + 1, 0
        if start < len(items):
            self._write_chunk(items[start:])

    def _write_chunk(self, items: list[Any]) -> None:
        # One pass to sort the batch (it holds ~150 items a token): fresh copies, writable ones.
        fresh: list[TensorItem] = []
        ok: list[TensorItem] = []
        weights: list[Any] = []
        for it in items:
            kind = type(it)
            if kind is TensorItem:
                if it.alias is None:
                    fresh.append(it)
                    data = it.tensor
                    it.dtype_name = DTYPE_NAMES.get(it.dtype) or dtype_name(it.dtype)
                    it.shape = data.shape  # a tuple (torch.Size is one): formatted, never mutated
                    if isinstance(data, np.ndarray) or (
                        type(data) is not Placeholder and _plain_tensor(data)
                    ):
                        ok.append(it)
            elif kind is WeightItem:
                weights.append(it)
        # the writer process gets a large array's statistics with it (capture/writer_process.py)
        todo = [it for it in ok if it.stats is None] if self.want_stats else []
        if todo:
            rows = batch_stats([it.tensor for it in todo], [it.dtype_name for it in todo])
            for it, row in zip(todo, rows, strict=True):
                it.stats = row
        payload: list[Any] = weights
        if self.want_payload:
            payload += [it for it in ok if it.dtype_name in SAFETENSORS_DTYPE]
        if payload:
            self._write_data_file(payload)
        if self.ring is not None:
            self.ring.wrote(
                payload[0].file if payload else "",
                {it.token for it in payload if type(it) is TensorItem},
            )
            for it in ok:  # outputs only: a mask input holds finfo.min by design
                if it.stem.startswith("output") and keep.anomalous(it.stats, it.dtype_name):
                    self.ring.anomaly(it.token)
        for it in fresh:
            it.done = True
        lines: list[str] = []
        new_topology = False
        if self.deferred:
            ready = [d for d in self.deferred if d.alias is not None and d.alias.done]
            self.deferred = [d for d in self.deferred if d.alias is None or not d.alias.done]
            lines.extend(tensor_line(d) for d in ready)
        heads = HEADS
        append = lines.append
        for it in items:
            kind = type(it)
            if kind is TensorItem:  # tensor_line(it), inlined: this runs for every tensor
                src = it.alias
                if src is None:
                    src = it
                elif not src.done:  # its bytes come with an outer module's inputs, queued later
                    self.deferred.append(it)
                    continue
                tail = src.tail or tail_text(src)
                node, stem, type_ = it.node, it.stem, it.node_type
                head = heads.get((node, stem, type_)) or head_text(node, stem, type_)
                append(f'{{"k":"t","token":{it.token},{head},"order":{it.order},{tail}')
            elif kind is TokenItem:
                if self.deferred:  # a target that never came (its module raised): drop
                    self.deferred = [d for d in self.deferred if d.token >= it.token]
                ids = None if it.ids is None else it.ids.reshape(-1).tolist()
                lines.append(
                    fmt.encode_line({"k": fmt.K_TOKEN, "token": it.token, "input_ids": ids})
                )
                self.tokens_seen = max(self.tokens_seen, it.token + 1)
                if self.ring is not None:
                    self.ring.started(it.token)
            elif kind is WeightItem:
                lines.append(
                    fmt.encode_line(
                        {
                            "k": fmt.K_WEIGHT,
                            "name": f"{it.node}.{it.param}",
                            "node": it.node,
                            "param": it.param,
                            "dtype": dtype_name(it.tensor.dtype),
                            "shape": list(it.tensor.shape),
                            "file": it.file,
                            "begin": it.begin,
                            "end": it.end,
                        }
                    )
                )
            elif kind is TopologyItem:
                self.topology = with_order(self.topology, it.order)
                new_topology = True
            elif kind is LineItem:
                lines.append(fmt.encode_line(it.obj))
        self.tensors_written += len(fresh)
        self.append_index("".join(lines))
        if self.ring is not None:
            self._drop_expired()
        if new_topology:  # after the lines: they matter more
            write_json_fast(self.run_dir / fmt.TOPOLOGY, self.topology)

    def _drop_expired(self) -> None:
        """Say first, then delete: a reader never meets a missing file the index still lists."""
        gone = self.ring.expired()  # type: ignore[union-attr]
        if gone:
            self.append_index("".join(fmt.encode_line({"k": fmt.K_DROP, "file": r}) for r in gone))
            for rel in gone:
                keep.remove(self.run_dir, rel)

    def _write_data_file(self, payload: list[Any]) -> None:
        parts: list[str] = []
        views: list[Any] = []
        offset = 0
        ndarray = np.ndarray
        for it in payload:  # offsets relative to the payloads first: the header's size is unknown
            data = it.tensor
            view = data if type(data) is ndarray else payload_view(data)
            end = offset + view.nbytes
            if type(it) is WeightItem:
                parts.append(
                    f'{quote(f"weights/{it.node}.{it.param}")}:{{"dtype":'
                    f'"{SAFETENSORS_DTYPE[dtype_name(data.dtype)]}","shape":[{shape_text(data.shape)}],'
                    f'"data_offsets":[{offset},{end}]}}'
                )
            else:
                parts.append(
                    f"{tensor_entry(it.token, it.node, it.stem, it.dtype_name, it.shape, offset)}"
                    f"{end}]}}"
                )
            views.append(view)
            it.begin, it.end = offset, end
            offset = end
        rel = fmt.data_file_name(self.seq)
        self.seq += 1
        base = write_batch_parts(self.run_dir / rel, parts, views)
        for it in payload:
            it.file = rel
            it.begin += base
            it.end += base
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
            self.append_index(
                fmt.encode_line(
                    {
                        "k": fmt.K_END,
                        "status": status,
                        "tokens": self.tokens_seen,
                        "tensors": self.tensors_written,
                    }
                )
            )
            write_json_fast(self.run_dir / fmt.MANIFEST, self.manifest(status))
        os.close(self.index_fd)

    def record_failure(self, message: str) -> None:
        try:
            self.append_index(fmt.encode_line({"k": fmt.K_ERROR, "message": message}))
        finally:
            write_json_fast(self.run_dir / fmt.MANIFEST, self.manifest("error: " + message))


def _plain_tensor(data: Any) -> bool:
    """A copy we can reduce and write (strided, real, not on the meta device); others are
    indexed with dtype and shape only (complex rotary tables, sparse masks...)."""
    import torch

    return data.layout is torch.strided and data.device.type != "meta" and not data.is_complex()
