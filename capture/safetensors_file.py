"""Bytes on disk: safetensors batch files written by hand, and atomic JSON files.

We write the safetensors format ourselves (8-byte little-endian header length, a JSON header
padded with spaces to a multiple of 8, then the raw C-contiguous payloads back to back, no gaps)
so the absolute offset of every payload is known before the file exists: index lines carry
them, and readers ``np.fromfile`` a tensor without parsing the header. ``safetensors.safe_open``
reads these files (tested). Everything goes to a ``.tmp-`` name first and is renamed into place;
a failed write removes its temp file.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from . import format as fmt
from .atomic import replacing
from .index_lines import shape_text

SAFETENSORS_DTYPE = {
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "float64": "F64",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "uint16": "U16",
    "uint32": "U32",
    "uint64": "U64",
}
"""safetensors' code of each torch dtype that a data file can hold, by the dtype's name (no
torch import: the writer process reduces and writes host arrays without torch)."""


JOIN_BELOW = 1 << 16
"""Payloads smaller than this are copied into one joined buffer per run of them (a copy of a
few KiB costs less than handing the kernel one more ``iovec`` from Python)."""
quote = json.encoder.encode_basestring_ascii
"""A str as a JSON string (the C encoder ``json.dumps`` uses)."""
_quote = quote


DTYPE_NAMES: dict[Any, str] = {}
"""torch dtype (or name) -> its name, filled by :func:`dtype_name`: a lookup per tensor."""


def dtype_name(dtype: Any) -> str:
    """``float32`` for ``torch.float32`` (and for ``"float32"``), cached in :data:`DTYPE_NAMES`."""
    name = DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def payload_view(data: Any) -> Any:
    """The raw bytes of a captured copy (numpy array, or a contiguous tensor on any device)."""
    if isinstance(data, np.ndarray):
        return data
    import torch

    if data.device.type != "cpu":
        data = data.cpu()
    return data.reshape(-1).view(torch.uint8).numpy()


def write_batch_file(path: Path, entries: list[tuple[str, Any, Any, Any]]) -> int:
    """Write ``entries`` (name, torch dtype, shape, payload) as one safetensors file, atomically.

    Returns the absolute offset of the first payload; payload ``i`` starts at that offset plus
    the sizes of the payloads before it.
    """
    parts: list[str] = []
    views: list[Any] = []
    offset = 0
    for name, dtype, shape, data in entries:
        view = payload_view(data)
        end = offset + view.nbytes
        parts.append(
            f'{_quote(name)}:{{"dtype":"{SAFETENSORS_DTYPE[dtype_name(dtype)]}",'
            f'"shape":[{shape_text(shape)}],'
            f'"data_offsets":[{offset},{end}]}}'
        )
        views.append(view)
        offset = end
    return write_batch_parts(path, parts, views)


_MIDS: dict[tuple[str, str, str, Any], str] = {}
"""(node, stem, dtype name, shape) -> the middle of its header entry: the same keys every token."""
_MIDS_MAX = 1 << 16


def tensor_entry(token: int, node: str, stem: str, dtype: str, shape: Any, begin: int) -> str:
    """The header entry of tensor ``{token}/{node}/{stem}`` (``capture/format.py``'s name, its
    dtype's name ``dtype``) whose
    payload starts at ``begin`` (relative to the payloads), ending in ``"data_offsets":[begin,``:
    the caller appends ``end]}``. All but the numbers is cached per key for the run."""
    key = (node, stem, dtype, shape)
    mid = _MIDS.get(key)
    if mid is None:
        if len(_MIDS) >= _MIDS_MAX:  # growing sequence lengths: keep the cache bounded
            _MIDS.clear()
        # the name's token is digits: quoting "/node/stem" alone escapes the same characters
        mid = _MIDS[key] = (
            f'{_quote(f"/{node}/{stem}")[1:]}:{{"dtype":"{SAFETENSORS_DTYPE[dtype]}",'
            f'"shape":[{shape_text(shape)}],"data_offsets":['
        )
    return f'"{token}{mid}{begin},'


def write_batch_parts(path: Path, parts: list[str], views: list[Any]) -> int:
    """Write a safetensors file from its header entries (``"name":{...}`` each, offsets
    relative to the payloads) and the payloads' raw bytes in the same order; returns the
    absolute offset of the first payload.

    Built for thousands of small tensors a file: consecutive small payloads are joined into
    one buffer, so the file takes a handful of ``writev`` calls and no per-tensor
    ``memoryview``; large payloads are written from their own memory, never copied.
    """
    buffers = joined(views)
    parts.append('"__metadata__":{"format":"pt","writer":"layerwatch"}')
    raw = ("{" + ",".join(parts) + "}").encode()
    raw += b" " * (-len(raw) % 8)
    with replacing(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _writev_all(fd, [struct.pack("<Q", len(raw)) + raw, *buffers], str(tmp))
        finally:
            os.close(fd)
    return 8 + len(raw)


def joined(views: list[Any]) -> list[Any]:
    """``views`` as few buffers: each run of small ones joined into one, large ones as they are
    (the data file and the writer process's pipe, ``capture/writer_process.py``)."""
    buffers: list[Any] = []
    small: list[Any] = []
    for view in views:
        if view.nbytes < JOIN_BELOW:
            small.append(view)
        else:
            if small:
                buffers.append(b"".join(small))
                small = []
            buffers.append(view)
    if small:
        buffers.append(b"".join(small))
    return buffers


def write_json_fast(path: Path, obj: Any) -> None:
    """Atomic compact JSON (the C encoder; ``indent`` would switch to the slow Python one).

    The temp file is removed if the write fails, so a full disk leaves no ``.tmp-`` behind.
    """
    try:
        text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    except ValueError:  # NaN/Inf (a fingerprint of broken weights): written as strings
        text = fmt.encode_line(obj)
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


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
