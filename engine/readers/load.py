"""Raw bytes at an offset → numpy, for every dump format, without importing torch.

Every reader resolves a tensor to a :class:`~layerwatch.engine.records.Locator` (file, byte
offset, dtype, shape, optional strides / NZ blocking), so loading is one read plus a view:
no pickle, no header parse, no torch (``import torch`` alone costs ~1.5 s). ``iter_chunks``
reads piecewise so a multi-GB tensor is compared in bounded memory.
"""

from __future__ import annotations

import functools
import io
import math
import os
import sys
import threading
from collections.abc import Iterator, Sequence

import numpy as np
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.records import Locator

_STORAGE: dict[str, str] = {
    "float32": "<f4",
    "float16": "<f2",
    "bfloat16": "<u2",  # widened to float32 by a bit shift (exact)
    "float64": "<f8",
    "int8": "i1",
    "uint8": "u1",
    "int16": "<i2",
    "uint16": "<u2",
    "int32": "<i4",
    "uint32": "<u4",
    "int64": "<i8",
    "uint64": "<u8",
    "bool": "?",
    "complex64": "<c8",
    "complex128": "<c16",
    "float8_e4m3fn": "u1",  # decoded through a 256-entry table
    "float8_e5m2": "u1",
}
_ALIASES = {
    "float": "float32",
    "fp32": "float32",
    "f32": "float32",
    "half": "float16",
    "fp16": "float16",
    "f16": "float16",
    "bf16": "bfloat16",
    "double": "float64",
    "fp64": "float64",
    "f64": "float64",
    "long": "int64",
    "int": "int32",
    "short": "int16",
    "char": "int8",
    "byte": "uint8",
    "cfloat": "complex64",
    "cdouble": "complex128",
    "complex": "complex64",
    "bool_": "bool",
    "i8": "int64",
    "i4": "int32",
    "i2": "int16",
    "i1": "int8",
    "u1": "uint8",
    "f2": "float16",
    "f4": "float32",
    "f8": "float64",
    "bf16_": "bfloat16",
    "float8_e4m3": "float8_e4m3fn",
}
NZ_M0 = 16
"""Rows per FRACTAL_NZ block (the block's N0 columns make 32 bytes)."""


_CANONICAL: dict[str, str] = {}
"""Names seen so far → canonical name (called per tensor: a dict hit instead of string work)."""


def canonical_dtype(name: str) -> str:
    """``torch.float32`` / ``fp32`` / ``float`` → ``float32``; unknown names raise ``LayerwatchError``."""
    known = _CANONICAL.get(name)
    if known is not None:
        return known
    key = name.strip().lower().removeprefix("torch.").removeprefix("np.").removeprefix("numpy.")
    key = _ALIASES.get(key, key)
    if key not in _STORAGE:
        raise LayerwatchError(f"unsupported dtype {name!r}")
    if len(_CANONICAL) < 1024:
        _CANONICAL[name] = key
    return key


_STORED = {name: np.dtype(code) for name, code in _STORAGE.items()}


def storage_dtype(name: str) -> np.dtype:
    """The numpy dtype of the bytes as stored (bf16 and fp8 as unsigned ints)."""
    return _STORED[canonical_dtype(name)]


def itemsize(name: str) -> int:
    return storage_dtype(name).itemsize


def result_dtype(name: str, as_float: bool = False) -> np.dtype:
    """dtype ``load_array`` returns for a stored dtype (bf16/fp8 → float32)."""
    dt = canonical_dtype(name)
    if dt in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        return np.dtype(np.float32)
    out = np.dtype(_STORAGE[dt]).newbyteorder("=")
    if as_float and out.kind in "biu":
        return np.dtype(np.float64)
    if as_float and out == np.float16:
        return np.dtype(np.float32)
    return out


def _fp8_table(exp_bits: int, man_bits: int, fn: bool) -> np.ndarray:
    """float32 value of every fp8 byte (e4m3fn: no inf, 0x7f/0xff NaN; e5m2: IEEE-like)."""
    bias = (1 << (exp_bits - 1)) - 1
    table = np.empty(256, np.float32)
    for byte in range(256):
        sign = -1.0 if byte & 0x80 else 1.0
        exp = (byte >> man_bits) & ((1 << exp_bits) - 1)
        man = byte & ((1 << man_bits) - 1)
        top = (1 << exp_bits) - 1
        if fn and exp == top and man == (1 << man_bits) - 1:
            value = math.nan
        elif not fn and exp == top:
            value = math.nan if man else sign * math.inf
        elif exp == 0:
            value = sign * man * 2.0 ** (1 - bias - man_bits)
        else:
            value = sign * (1 + man / (1 << man_bits)) * 2.0 ** (exp - bias)
        table[byte] = value
    return table


_FP8 = {"float8_e4m3fn": _fp8_table(4, 3, True), "float8_e5m2": _fp8_table(5, 2, False)}


def _decode(raw: np.ndarray, dt: str, as_float: bool) -> np.ndarray:
    """Stored elements → result elements (a no-op view for most dtypes)."""
    if dt == "bfloat16":
        # one pass, one allocation: widen and shift together (1.2× a widen-then-shift)
        return np.left_shift(raw, 16, dtype=np.uint32).view(np.float32)
    if dt in _FP8:
        return _FP8[dt][raw]
    if not raw.dtype.isnative:
        raw = raw.astype(raw.dtype.newbyteorder("="))
    if as_float:
        target = result_dtype(dt, True)
        if raw.dtype != target:
            return raw.astype(target)
    return raw


@functools.lru_cache(maxsize=256)
def _header_end(path: str, size: int, mtime_ns: int) -> int | None:
    """Where a ``.safetensors`` file's JSON header ends, or None when the file has none.

    Payloads are read at the index's offsets without parsing the header (capture/format.py),
    so bytes that are not ours — a file overwritten with other data — would be read as numbers
    and judged as a numerical fault. Checking the 8-byte length and the opening brace, once
    per file version (``size``/``mtime_ns`` key the cache), tells damaged input from a finding.
    """
    del size, mtime_ns  # cache key only
    try:
        with open(path, "rb") as fh:
            head = fh.read(9)
    except OSError:
        return None
    if len(head) < 9 or head[8:9] != b"{":
        return None
    return 8 + int.from_bytes(head[:8], "little")  # past the file's end: reads say "truncated"


def _check_container(loc: Locator) -> None:
    """A one-line error when ``loc`` points into a ``.safetensors`` file that is not one."""
    if not loc.path.endswith(".safetensors"):
        return
    try:
        st = os.stat(loc.path)
    except FileNotFoundError:
        raise LayerwatchError(f"{loc.path}: file not found") from None
    except OSError as exc:
        raise LayerwatchError(f"{loc.path}: cannot read: {exc}") from None
    end = _header_end(loc.path, st.st_size, st.st_mtime_ns)
    if end is None or loc.offset < end:
        raise LayerwatchError(f"{loc.path}: not a safetensors file (damaged or overwritten)")


def _read(loc: Locator, first: int, count: int, sdt: np.dtype) -> np.ndarray:
    """``count`` stored elements starting at element ``first`` of the storage, or a one-line error."""
    if count <= 0:
        return np.empty(0, sdt)
    _check_container(loc)
    try:
        raw = np.fromfile(
            loc.path, dtype=sdt, count=count, offset=loc.offset + first * sdt.itemsize
        )
    except FileNotFoundError:
        raise LayerwatchError(f"{loc.path}: file not found") from None
    except (OSError, ValueError) as exc:
        raise LayerwatchError(f"{loc.path}: cannot read: {exc}") from None
    if raw.size < count:
        need = loc.offset + (first + count) * sdt.itemsize
        raise LayerwatchError(
            f"{loc.path}: truncated (needs {need} bytes, the tensor is cut short)"
        )
    return raw


def _extent(shape: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """Number of storage elements a strided view spans (0 for an empty view)."""
    if any(d == 0 for d in shape):
        return 0
    if any(s < 0 for s in strides):
        raise LayerwatchError(f"negative strides {strides} are not supported")
    return 1 + sum((d - 1) * s for d, s in zip(shape, strides, strict=True))


def _is_contiguous(shape: tuple[int, ...], strides: tuple[int, ...] | None) -> bool:
    if strides is None:
        return True
    expect = 1
    for d, s in zip(reversed(shape), reversed(strides), strict=True):
        if d != 1 and s != expect:
            return False
        expect *= d
    return True


def _nz_geometry(loc: Locator) -> tuple[int, int, int, int, int, int]:
    """(batch, M, N, N1, Mp, N0) of an NZ tensor: ND ``shape`` (..., M, N) stored as (B, N1, Mp, N0)."""
    shape = tuple(loc.shape)
    if len(shape) < 2:
        raise LayerwatchError(
            f"{loc.path}: FRACTAL_NZ tensor needs a ND shape of rank >= 2, got {shape}"
        )
    batch = math.prod(shape[:-2])
    m, n = shape[-2], shape[-1]
    if loc.stored_shape:
        n0 = loc.stored_shape[-1]
        total = math.prod(loc.stored_shape)
    else:
        n0 = max(1, 32 // itemsize(loc.dtype))
        total = batch * -(-n // n0) * -(-m // NZ_M0) * NZ_M0 * n0
    n1 = -(-n // n0) if n0 else 0
    denom = batch * n1 * n0
    mp = total // denom if denom else 0
    if denom == 0 or mp * denom != total or mp < m:
        raise LayerwatchError(
            f"{loc.path}: FRACTAL_NZ stored shape {loc.stored_shape} does not hold ND shape {shape}"
        )
    return batch, m, n, n1, mp, n0


def load_array(loc: Locator, *, as_float: bool = False) -> np.ndarray:
    """The whole tensor in its logical ``shape``: bf16/fp8 → float32, other dtypes kept.

    ``as_float=True`` additionally widens fp16 → float32 and ints/bools → float64.
    """
    dt = canonical_dtype(loc.dtype)
    sdt = storage_dtype(dt)
    shape = tuple(int(d) for d in loc.shape)
    if loc.layout == "nz":
        batch, m, n, n1, mp, n0 = _nz_geometry(loc)
        raw = _read(loc, loc.elem_offset, batch * n1 * mp * n0, sdt)
        blocks = raw.reshape(batch, n1, mp, n0).transpose(0, 2, 1, 3).reshape(batch, mp, n1 * n0)
        nd = np.ascontiguousarray(blocks[:, :m, :n]).reshape(shape)
        return _decode(nd, dt, as_float)
    if loc.layout:
        raise LayerwatchError(f"{loc.path}: unsupported tensor layout {loc.layout!r}")
    strides = tuple(int(s) for s in loc.strides) if loc.strides is not None else None
    if _is_contiguous(shape, strides):
        raw = _read(loc, loc.elem_offset, math.prod(shape), sdt)
        return _decode(raw, dt, as_float).reshape(shape)
    assert strides is not None
    window = _read(loc, loc.elem_offset, _extent(shape, strides), sdt)
    if window.size == 0:
        return np.empty(shape, result_dtype(dt, as_float))
    view = np.lib.stride_tricks.as_strided(
        window, shape, tuple(s * sdt.itemsize for s in strides), writeable=False
    )
    return _decode(np.ascontiguousarray(view), dt, as_float)


def iter_chunks(
    loc: Locator,
    max_elems: int,
    *,
    as_float: bool = False,
    reuse: bool = False,
    bf16_bits: bool = False,
) -> Iterator[np.ndarray]:
    """The tensor's elements in C order as consecutive 1-D chunks of at most ``max_elems``.

    Contiguous tensors are read piecewise with ``np.fromfile``; strided views and NZ blocks go
    through a read-only memory map, so only about one chunk at a time is in memory.

    ``reuse=True`` (streaming consumers that are done with a chunk before asking for the next,
    like the metric pass): contiguous tensors are read into one buffer per iterator, refilled
    for every chunk (``readinto``), and bf16/fp8 are decoded into a second one. A cache-sized
    buffer that is refilled in place costs no allocation, no page faults and no trip through
    main memory; a fresh ``np.fromfile`` array per chunk costs all three.

    ``bf16_bits=True`` (with ``reuse``, contiguous tensors): bf16 chunks come as their uint16
    bits, for a consumer that decodes them on the fly (the compiled metric kernel); check
    :func:`yields_bf16_bits` to know whether they will.
    """
    if max_elems <= 0:
        raise ValueError("max_elems must be positive")
    dt = canonical_dtype(loc.dtype)
    sdt = storage_dtype(dt)
    shape = tuple(int(d) for d in loc.shape)
    strides = tuple(int(s) for s in loc.strides) if loc.strides is not None else None
    total = math.prod(shape)
    if loc.layout == "" and _is_contiguous(shape, strides):
        if reuse and total:
            _check_container(loc)
            yield from _reused_chunks(loc, total, max_elems, dt, sdt, as_float, bf16_bits)
            return
        for start in range(0, total, max_elems):
            count = min(max_elems, total - start)
            yield _decode(_read(loc, loc.elem_offset + start, count, sdt), dt, as_float)
        return
    if total == 0:
        return
    if total <= max_elems:
        yield load_array(loc, as_float=as_float).reshape(-1)
        return
    if loc.layout == "nz":
        pieces = _nz_pieces(loc, sdt, max_elems)
    elif loc.layout:
        raise LayerwatchError(f"{loc.path}: unsupported tensor layout {loc.layout!r}")
    else:
        assert strides is not None
        mm = _memmap(loc, loc.elem_offset, _extent(shape, strides), sdt)
        view = np.lib.stride_tricks.as_strided(
            mm, shape, tuple(s * sdt.itemsize for s in strides), writeable=False
        )
        pieces = (np.ascontiguousarray(p).reshape(-1) for p in _pieces(view, max_elems))
    for chunk in _rechunk(pieces, max_elems):
        yield _decode(chunk, dt, as_float)


def yields_bf16_bits(loc: Locator) -> bool:
    """Whether ``iter_chunks(loc, ..., reuse=True, bf16_bits=True)`` yields uint16 bf16 bits."""
    dt = canonical_dtype(loc.dtype)
    strides = tuple(int(s) for s in loc.strides) if loc.strides is not None else None
    shape = tuple(int(d) for d in loc.shape)
    return dt == "bfloat16" and loc.layout == "" and _is_contiguous(shape, strides)


def _reused_chunks(
    loc: Locator,
    total: int,
    max_elems: int,
    dt: str,
    sdt: np.dtype,
    as_float: bool,
    bf16_bits: bool = False,
) -> Iterator[np.ndarray]:
    """Contiguous payload in chunks read into (and decoded in) buffers owned by this iterator."""
    size = min(total, max_elems)
    raw = np.empty(size, sdt)
    decode = ChunkDecoder(dt, size, as_float, bf16_bits)
    view = raw.data.cast("B")
    item = sdt.itemsize
    fh = open_payload(loc)
    try:
        fh.seek(loc.offset + loc.elem_offset * item)
        for start in range(0, total, max_elems):
            count = min(max_elems, total - start)
            fill(fh, view, count * item, loc, start + count)
            yield decode(raw[:count])
    finally:
        fh.close()


class _HeldFiles:
    """Whole small files a reader has just read, kept until their payload is loaded once.

    A small ``.pth`` header read takes the whole file in one ``pread`` (engine/readers/pth.py);
    loading its payload again cost an ``open``/``pread``/``close`` per tensor, ~10 µs each
    (~18 ms of bench case (b)'s 1 776 loads). :func:`load_flat` slices those bytes instead:
    the same bytes the locator was parsed from. Each entry is taken once (a reload reads the
    file); at most :attr:`LIMIT` bytes are held, the oldest dropped first (records a compare
    never loads, or that worker processes loaded, age out)."""

    LIMIT = 16 << 20
    BIGGEST = 1 << 16
    """Files above this are never held (payloads of MB-sized tensors are streamed)."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.held = 0
        self._lock = threading.Lock()

    def keep(self, path: str, data: bytes) -> None:
        if len(data) > self.BIGGEST:
            return
        with self._lock:
            old = self.files.pop(path, None)
            if old is not None:
                self.held -= len(old)
            while self.files and self.held + len(data) > self.LIMIT:
                self.held -= len(self.files.pop(next(iter(self.files))))
            self.files[path] = data
            self.held += len(data)

    def take(self, path: str) -> bytes | None:
        if not self.files:
            return None
        with self._lock:
            data = self.files.pop(path, None)
            if data is not None:
                self.held -= len(data)
        return data

    def clear(self) -> None:
        with self._lock:
            self.files.clear()
            self.held = 0


HELD = _HeldFiles()
"""The process's held small files (:meth:`_HeldFiles.keep` by readers, taken by :func:`load_flat`)."""


def open_payload(loc: Locator) -> io.FileIO:
    """An unbuffered handle on ``loc``'s file (read straight into the caller's buffer), or a
    one-line error."""
    try:
        return open(loc.path, "rb", buffering=0)
    except FileNotFoundError:
        raise LayerwatchError(f"{loc.path}: file not found") from None
    except OSError as exc:
        raise LayerwatchError(f"{loc.path}: cannot read: {exc}") from None


def fill(fh: io.FileIO, view: memoryview, want: int, loc: Locator, end: int) -> None:
    """Read exactly ``want`` bytes at ``fh``'s position into ``view``; ``end``: the element of
    the tensor the read reaches, for the message when the file is cut short."""
    got = 0
    while got < want:
        try:
            n = fh.readinto(view[got:want])
        except OSError as exc:
            raise LayerwatchError(f"{loc.path}: cannot read: {exc}") from None
        if not n:
            need = loc.offset + (loc.elem_offset + end) * storage_dtype(loc.dtype).itemsize
            raise LayerwatchError(
                f"{loc.path}: truncated (needs {need} bytes, the tensor is cut short)"
            )
        got += n


class ChunkDecoder:
    """Stored chunks → the elements :func:`iter_chunks` yields, decoded into buffers it owns
    and refills (bf16 widened, fp8 through its table; ``bf16_bits``: bf16 passed on as bits)."""

    def __init__(self, dt: str, size: int, as_float: bool = False, bf16_bits: bool = False):
        self.dt, self.as_float, self.bits = dt, as_float, bf16_bits
        self.wide = np.empty(size, np.uint32) if dt == "bfloat16" and not bf16_bits else None
        self.table = _FP8.get(dt)
        self.decoded = np.empty(size, np.float32) if self.table is not None else None

    def __call__(self, chunk: np.ndarray) -> np.ndarray:
        count = chunk.size
        if self.wide is not None:
            out = np.left_shift(chunk, 16, out=self.wide[:count], dtype=np.uint32)
            return out.view(np.float32)
        if self.dt == "bfloat16":  # bf16_bits: the consumer decodes
            return chunk
        if self.table is not None and self.decoded is not None:
            return np.take(self.table, chunk, out=self.decoded[:count])
        return _decode(chunk, self.dt, self.as_float)


def load_flat(loc: Locator) -> np.ndarray:
    """The tensor's elements in C order, 1-D, decoded like :func:`load_array` — with the fewest
    system calls for a small contiguous payload (``open``/``pread``/``close``, no file object)."""
    dt = canonical_dtype(loc.dtype)
    if loc.layout or (
        loc.strides is not None and not _is_contiguous(tuple(loc.shape), tuple(loc.strides))
    ):
        return load_array(loc).reshape(-1)
    sdt = _STORED[dt]
    want = math.prod(loc.shape) * sdt.itemsize
    start = loc.offset + loc.elem_offset * sdt.itemsize
    if want:
        _check_container(loc)
    whole = HELD.take(loc.path)
    if whole is not None and start + want <= len(whole):
        return _decode(np.frombuffer(whole, sdt, want // sdt.itemsize, start), dt, False)
    try:
        fd = os.open(loc.path, os.O_RDONLY)
    except FileNotFoundError:
        raise LayerwatchError(f"{loc.path}: file not found") from None
    except OSError as exc:
        raise LayerwatchError(f"{loc.path}: cannot read: {exc}") from None
    try:
        data = os.pread(fd, want, start) if want else b""
        while len(data) < want:  # a short read before the end of the file: keep reading
            more = os.pread(fd, want - len(data), start + len(data))
            if not more:
                raise LayerwatchError(
                    f"{loc.path}: truncated (needs {start + want} bytes, the tensor is cut short)"
                )
            data += more
    except OSError as exc:
        raise LayerwatchError(f"{loc.path}: cannot read: {exc}") from None
    finally:
        os.close(fd)
    return _decode(np.frombuffer(data, sdt), dt, False)


LOAD_ERRORS = (LayerwatchError, OSError, ValueError, MemoryError)
"""What :func:`load_flat` raises for a payload that cannot be read (the compare's ``error``)."""
SPAN_SLACK = 1 << 20
"""Bytes between the payloads of one file that :func:`load_flat_many` reads through rather
than seeking over them (beyond twice the payloads' own bytes)."""


def load_flat_many(locs: Sequence[Locator]) -> list[np.ndarray | Exception]:
    """:func:`load_flat` of each locator, in order, or the error it raised in its place (one of
    :data:`LOAD_ERRORS`, the same message). The plain payloads of one file are read with one
    ``open`` and one ``pread`` of the bytes they span, where they lie close together (the
    writer stores a batch of tensors back to back): a small-tensor compare spent ~15 µs a pair
    on a ``stat``/``open``/``pread``/``close`` for each side. Anything else (a view, NZ blocks,
    a file the header reader holds, a lone payload) goes through :func:`load_flat`."""
    out: list[np.ndarray | Exception | None] = [None] * len(locs)
    groups: dict[str, list[int]] = {}
    alone: list[int] = []  # msit's small files: every one (its bytes held by the header read)
    held = HELD.files
    for i, loc in enumerate(locs):
        if loc.layout or loc.strides is not None or loc.elem_offset or loc.path in held:
            alone.append(i)
        else:
            groups.setdefault(loc.path, []).append(i)
    for i in alone:
        try:
            out[i] = load_flat(locs[i])
        except LOAD_ERRORS as exc:
            out[i] = exc
    for members in groups.values():
        if len(members) < 2 or not _load_group(locs, members, out):
            for i in members:
                try:
                    out[i] = load_flat(locs[i])
                except LOAD_ERRORS as exc:
                    out[i] = exc
    return out  # type: ignore[return-value]  # every slot was filled


_KINDS: dict[tuple[str, tuple[int, ...]], tuple[str, np.dtype, int]] = {}
"""(dtype name, shape) → canonical dtype, stored dtype, payload bytes (the same few on every
token)."""


def _load_group(
    locs: Sequence[Locator], members: list[int], out: list[np.ndarray | Exception | None]
) -> bool:
    """Fill ``out`` for ``members`` (plain payloads of one file) from one read of the span
    they cover; False (nothing filled) when they are too far apart or of odd dtypes."""
    path = locs[members[0]].path
    parts: list[tuple[int, str, np.dtype, int, int]] = []
    wanted = 0
    for i in members:
        loc = locs[i]
        try:
            kind = _KINDS[(loc.dtype, loc.shape)]
        except (KeyError, TypeError):  # TypeError: a shape given as a list
            try:
                dt = canonical_dtype(loc.dtype)
            except LayerwatchError:
                return False
            sdt = _STORED[dt]
            kind = (dt, sdt, math.prod(loc.shape) * sdt.itemsize)
            if len(_KINDS) < 1024 and isinstance(loc.shape, tuple):
                _KINDS[(loc.dtype, loc.shape)] = kind
        dt, sdt, want = kind
        if not want:
            return False
        parts.append((i, dt, sdt, loc.offset, want))
        wanted += want
    low = min(p[3] for p in parts)
    high = max(p[3] + p[4] for p in parts)
    if high - low > 2 * wanted + SPAN_SLACK:
        return False
    try:
        end = _container_end(path)
        fd = os.open(path, os.O_RDONLY)
    except LayerwatchError as exc:
        for i in members:
            out[i] = exc
        return True
    except FileNotFoundError:
        return False  # load_flat words it per payload
    except OSError:
        return False
    try:
        data = os.pread(fd, high - low, low)
        while len(data) < high - low:  # a short read before the end of the file
            more = os.pread(fd, high - low - len(data), low + len(data))
            if not more:
                break
            data += more
    except OSError:
        return False
    finally:
        os.close(fd)
    for i, dt, sdt, start, want in parts:
        if start < end:
            out[i] = LayerwatchError(f"{path}: not a safetensors file (damaged or overwritten)")
        elif start + want > low + len(data):
            out[i] = LayerwatchError(
                f"{path}: truncated (needs {start + want} bytes, the tensor is cut short)"
            )
        else:
            out[i] = _decode(np.frombuffer(data, sdt, want // sdt.itemsize, start - low), dt, False)
    return True


def _container_end(path: str) -> int:
    """:func:`_check_container` of a whole file: where its header ends (a payload that starts
    before it is an error); 0 for a file that is no ``.safetensors``."""
    if not path.endswith(".safetensors"):
        return 0  # no header to be past
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise LayerwatchError(f"{path}: file not found") from None
    except OSError as exc:
        raise LayerwatchError(f"{path}: cannot read: {exc}") from None
    end = _header_end(path, st.st_size, st.st_mtime_ns)
    return sys.maxsize if end is None else end  # no header: every payload is "inside" it


def _rechunk(pieces: Iterator[np.ndarray], max_elems: int) -> Iterator[np.ndarray]:
    """Join small C-ordered pieces (each <= ``max_elems``) into chunks of at most ``max_elems``."""
    buf: list[np.ndarray] = []
    held = 0
    for piece in pieces:
        if held and held + piece.size > max_elems:
            yield buf[0] if len(buf) == 1 else np.concatenate(buf)
            buf, held = [], 0
        buf.append(piece)
        held += piece.size
    if held:
        yield buf[0] if len(buf) == 1 else np.concatenate(buf)


def _pieces(view: np.ndarray, max_elems: int) -> Iterator[np.ndarray]:
    """Sub-views of ``view`` in C order, each at most ``max_elems`` elements."""
    if view.size <= max_elems:
        yield view
    elif view.ndim == 1:
        for start in range(0, view.shape[0], max_elems):
            yield view[start : start + max_elems]
    else:
        inner = math.prod(view.shape[1:])
        if inner <= max_elems:
            step = max_elems // inner
            for start in range(0, view.shape[0], step):
                yield view[start : start + step]
        else:
            for i in range(view.shape[0]):
                yield from _pieces(view[i], max_elems)


def _nz_pieces(loc: Locator, sdt: np.dtype, max_elems: int) -> Iterator[np.ndarray]:
    """ND rows of an NZ tensor, a few rows at a time, from a memory map of the blocks."""
    batch, m, n, n1, mp, n0 = _nz_geometry(loc)
    blocks = _memmap(loc, loc.elem_offset, batch * n1 * mp * n0, sdt).reshape(batch, n1, mp, n0)
    if n <= max_elems:
        step = max(1, max_elems // n)
        for b in range(batch):
            for start in range(0, m, step):
                rows = blocks[b, :, start : min(m, start + step), :]  # (n1, r, n0)
                nd = np.ascontiguousarray(rows.transpose(1, 0, 2)).reshape(-1, n1 * n0)[:, :n]
                yield nd.reshape(-1)
    else:
        for b in range(batch):
            for row in range(m):
                nd_row = np.ascontiguousarray(blocks[b, :, row, :]).reshape(-1)[:n]
                for start in range(0, n, max_elems):
                    yield nd_row[start : start + max_elems]


def _memmap(loc: Locator, first: int, count: int, sdt: np.dtype) -> np.ndarray:
    """Read-only map of ``count`` stored elements; the file size is checked first (no SIGBUS)."""
    start = loc.offset + first * sdt.itemsize
    _check_container(loc)
    try:
        size = os.path.getsize(loc.path)
    except FileNotFoundError:
        raise LayerwatchError(f"{loc.path}: file not found") from None
    except OSError as exc:
        raise LayerwatchError(f"{loc.path}: cannot read: {exc}") from None
    if start + count * sdt.itemsize > size:
        need = start + count * sdt.itemsize
        raise LayerwatchError(
            f"{loc.path}: truncated (needs {need} bytes, the tensor is cut short)"
        )
    return np.memmap(loc.path, dtype=sdt, mode="r", offset=start, shape=(count,))
