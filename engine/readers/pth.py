"""Read a ``torch.save`` file (``.pth``/``.pt``) into a :class:`Locator` without importing torch.

A torch zip file is a ZIP_STORED archive: ``{name}/data.pkl`` (a small pickle describing the
tensor) and ``{name}/data/{key}`` (the raw storage bytes). We parse the zip directory with
``struct`` and the pickle with a restricted :class:`pickle.Unpickler` whose ``find_class``
hands out inert stand-ins for the handful of globals a tensor pickle uses; every other global
is refused before anything runs. The result points at the storage member's absolute offset, so
loading is a plain ``np.fromfile``. Files the fast path cannot parse (torch's legacy non-zip
format, exotic tensor types) fall back to ``torch.load(weights_only=True)`` and a cached ``.npy``.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
from collections import OrderedDict
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any

from layerwatch.capture.atomic import replacing
from layerwatch.capture.errors import LayerwatchError
from layerwatch.capture.framing import ZIP_LOCAL, zip64_locator, zip_end_record
from layerwatch.engine.readers.load import HELD, canonical_dtype, itemsize
from layerwatch.engine.records import Locator, plain_locator

_SMALL = 1 << 16
"""Files up to this size are read in one go; larger ones read their tail and headers only."""
_EOCD_S = struct.Struct("<4sHHHHIIH")


class PthIncomplete(LayerwatchError):
    """The file's zip framing is not complete yet (still being written): retry later."""


class PthRefused(LayerwatchError):
    """The pickle asked for a global that is not part of a tensor: refused, nothing executed."""


# --- zip directory ---------------------------------------------------------------------------
_CD_FIELDS = struct.Struct("<4s6xH8xIIHHH8xI")
"""Of a central-directory record: signature, method, compressed and uncompressed size, name,
extra and comment lengths, local header offset (46 bytes; the rest is skipped)."""
_LOCAL_LENS = struct.Struct("<4s22xHH")
"""Of a local header: signature, name and extra lengths (30 bytes)."""


_TAIL = 4096
"""Large files read this much of their end first: a torch zip's directory is a few hundred
bytes, so reading ``_SMALL`` (64 KiB) of every file's end cost more than parsing it."""


def _members(
    path: str, fd: int, size: int, head: bytes, starts: list[int] | None = None
) -> dict[str, tuple[int, int]]:
    """Stored members of a zip: name → (local header offset, size) (raises PthIncomplete).
    ``starts``: filled with the central directory's offset, then each record's in it."""
    tail = head if len(head) == size else os.pread(fd, min(size, _TAIL), max(0, size - _TAIL))
    pos = zip_end_record(tail)
    if pos < 0 and len(tail) < min(size, _SMALL):  # a long zip comment: look further back
        tail = os.pread(fd, min(size, _SMALL), max(0, size - _SMALL))
        pos = zip_end_record(tail)
    if pos < 0:
        raise PthIncomplete(f"{path}: zip directory missing (file incomplete?)")
    tail_start = size - len(tail)
    _, _, _, _, count, cd_size, cd_offset, _ = _EOCD_S.unpack_from(tail, pos)
    if cd_offset == 0xFFFFFFFF or count == 0xFFFF:
        loc = zip64_locator(tail, pos)
        if loc < 0:
            raise PthIncomplete(f"{path}: zip64 directory locator missing")
        (eocd64,) = struct.unpack_from("<Q", tail, loc + 8)
        rec = _pread(fd, eocd64, 56, tail, tail_start)
        count, cd_size, cd_offset = struct.unpack_from("<QQQ", rec, 32)
    if cd_offset + cd_size > size:
        raise PthIncomplete(f"{path}: zip directory points past the end of the file")
    cd = _pread(fd, cd_offset, cd_size, tail, tail_start)
    if starts is not None:
        starts.append(cd_offset)
    return _parse_directory(path, cd, count, starts)


def _parse_directory(
    path: str, cd: bytes, count: int, starts: list[int] | None = None
) -> dict[str, tuple[int, int]]:
    """``starts``: filled with each record's offset in ``cd`` (for :class:`_Shapes`)."""
    out: dict[str, tuple[int, int]] = {}
    at = 0
    unpack = _CD_FIELDS.unpack_from
    try:
        for _ in range(count):
            if starts is not None:
                starts.append(at)
            sig, method, csize, usize, name_len, extra_len, comment_len, lho = unpack(cd, at)
            if sig != b"PK\x01\x02":
                raise LayerwatchError(f"{path}: corrupt zip directory")
            start = at + 46
            name = cd[start : start + name_len].decode("utf-8", "replace")
            if csize == 0xFFFFFFFF or lho == 0xFFFFFFFF:
                extra = cd[start + name_len : start + name_len + extra_len]
                csize, lho = _zip64_extra(extra, usize, csize, lho)
            at = start + name_len + extra_len + comment_len
            if method != 0:
                raise LayerwatchError(
                    f"{path}: compressed zip member {name} (not a torch.save file)"
                )
            out[name] = (lho, csize)  # data offset resolved lazily from the local header
    except struct.error:
        raise LayerwatchError(f"{path}: corrupt zip directory") from None
    return out


def _zip64_extra(extra: bytes, usize: int, csize: int, lho: int) -> tuple[int, int]:
    at = 0
    while at + 4 <= len(extra):
        tag, length = struct.unpack_from("<HH", extra, at)
        if tag == 1:
            values = list(struct.unpack_from(f"<{length // 8}Q", extra, at + 4))
            if usize == 0xFFFFFFFF and values:
                values.pop(0)
            if csize == 0xFFFFFFFF and values:
                csize = values.pop(0)
            if lho == 0xFFFFFFFF and values:
                lho = values.pop(0)
            break
        at += 4 + length
    return csize, lho


def _pread(fd: int, offset: int, length: int, buf: bytes, buf_start: int) -> bytes:
    """``length`` bytes at ``offset``, from ``buf`` when it covers them, else from the file."""
    if offset >= buf_start and offset + length <= buf_start + len(buf):
        return buf[offset - buf_start : offset - buf_start + length]
    return os.pread(fd, length, offset)


def _data_offset(
    path: str, fd: int, name: str, member: tuple[int, int], head: bytes, size: int
) -> int:
    lho, length = member
    local = _pread(fd, lho, 30, head, 0)
    if len(local) < 30:
        raise LayerwatchError(f"{path}: corrupt zip member {name}")
    sig, name_len, extra_len = _LOCAL_LENS.unpack(local)
    if sig != b"PK\x03\x04":
        raise LayerwatchError(f"{path}: corrupt zip member {name}")
    start = lho + 30 + name_len + extra_len
    if start + length > size:
        raise PthIncomplete(f"{path}: member {name} runs past the end of the file")
    return start


# --- restricted unpickling -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _StorageType:
    dtype: str | None
    """``None`` for ``UntypedStorage`` (the dtype comes from ``_rebuild_tensor_v3``)."""


@dataclass(frozen=True, slots=True)
class _DType:
    name: str


@dataclass(frozen=True, slots=True)
class _Storage:
    dtype: str | None
    key: str
    numel: int


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """What a tensor pickle says: storage key, dtype, view geometry."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int


def _spec(storage: Any, offset: Any, size: Any, stride: Any, dtype: str | None) -> TensorSpec:
    if not isinstance(storage, _Storage) or dtype is None:
        raise PthRefused("tensor pickle without a storage")
    return TensorSpec(
        storage.key, dtype, tuple(int(d) for d in size), tuple(int(s) for s in stride), int(offset)
    )


def _rebuild_tensor_v2(storage: Any, offset: Any, size: Any, stride: Any, *_: Any) -> TensorSpec:
    return _spec(storage, offset, size, stride, getattr(storage, "dtype", None))


def _rebuild_tensor_v3(
    storage: Any, offset: Any, size: Any, stride: Any, _rg: Any, _hooks: Any, dtype: Any, *_: Any
) -> TensorSpec:
    name = dtype.name if isinstance(dtype, _DType) else getattr(storage, "dtype", None)
    return _spec(storage, offset, size, stride, name)


def _rebuild_parameter(data: Any, *_: Any) -> Any:
    return data


def _rebuild_from_type_v2(func: Any, new_type: Any, args: Any, state: Any) -> Any:
    if new_type not in (_TENSOR_TYPE, _PARAMETER_TYPE) or func not in _REBUILDERS:
        raise PthRefused("tensor subclass is not supported")
    return func(*args)


_TENSOR_TYPE = _DType("Tensor")
_PARAMETER_TYPE = _DType("Parameter")
_REBUILDERS = (_rebuild_tensor_v2, _rebuild_tensor_v3, _rebuild_parameter)
_LEGACY_STORAGES = {
    "FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool",
    "ComplexFloatStorage": "complex64", "ComplexDoubleStorage": "complex128",
}  # fmt: skip
_DTYPES = [
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e5m2",
]
_ITEMSIZE = {d: itemsize(d) for d in _DTYPES}
_ALLOWED: dict[tuple[str, str], Any] = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2,
    ("torch", "Tensor"): _TENSOR_TYPE,
    ("torch.nn.parameter", "Parameter"): _PARAMETER_TYPE,
    ("torch.storage", "UntypedStorage"): _StorageType(None),
    ("torch", "UntypedStorage"): _StorageType(None),
    ("collections", "OrderedDict"): OrderedDict,
    **{("torch", k): _StorageType(v) for k, v in _LEGACY_STORAGES.items()},
    **{("torch", d): _DType(d) for d in _DTYPES},
}


class _TensorUnpickler(pickle.Unpickler):
    """Knows only tensor globals; anything else raises before it can be called."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise PthRefused(f"refused global {module}.{name}") from None

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise PthRefused("unexpected persistent id in tensor pickle")
        _, stype, key, _location, numel = pid
        if not isinstance(stype, _StorageType):
            raise PthRefused("unexpected storage type in tensor pickle")
        return _Storage(stype.dtype, str(key), int(numel))


_FACTS: dict[bytes, tuple[TensorSpec, tuple[int, ...] | None, int]] = {}
"""(spec, strides unless contiguous, bytes the view spans) by ``data.pkl`` bytes: a dump's
tensors share a few dozen distinct pickles (same dtype, shape, storage key), and all of this is
a pure function of the bytes."""


def _facts(data: bytes) -> tuple[TensorSpec, tuple[int, ...] | None, int]:
    facts = _FACTS.get(data)
    if facts is None:
        spec = _parse_tensor_pickle(data)
        numel_needed = 0
        if all(d > 0 for d in spec.shape):
            numel_needed = (
                spec.storage_offset
                + 1
                + sum((d - 1) * s for d, s in zip(spec.shape, spec.stride, strict=True))
            )
        size_of = _ITEMSIZE.get(spec.dtype) or itemsize(canonical_dtype(spec.dtype))
        strides = None if spec.stride == _contiguous(spec.shape) else spec.stride
        facts = (spec, strides, numel_needed * size_of)
        if len(_FACTS) >= 4096:
            _FACTS.clear()
        _FACTS[data] = facts
    return facts


def _parse_tensor_pickle(data: bytes) -> TensorSpec:
    try:
        obj = _TensorUnpickler(io.BytesIO(data)).load()
    except PthRefused:
        raise
    except Exception as exc:  # malformed pickles: any error is a refusal, never a crash
        raise PthRefused(f"unreadable tensor pickle ({type(exc).__name__}: {exc})") from None
    if not isinstance(obj, TensorSpec):
        raise PthRefused(f"holds a {type(obj).__name__}, not a single tensor")
    return obj


# --- layouts seen before --------------------------------------------------------------------
@dataclass(slots=True)
class _Layout:
    """Where one zip layout keeps what a locator needs (offsets valid for any file whose
    central directory equals this one's but for the CRC fields, at the same size)."""

    pkl: tuple[int, int]
    """(start, length) of ``data.pkl``'s bytes."""
    order: int | None
    """Start of ``byteorder``'s 6 bytes, or None when the file has none."""
    storages: dict[str, tuple[int, int]]
    """Storage key → (payload start, stored length), for the keys seen so far."""
    local: tuple[tuple[int, bytes], ...]
    """(offset, the 4 length bytes at offset 26) of each local header used: checked on reuse."""
    marks: Any = None
    """``itemgetter`` of the bytes a reuse checks — each local header's signature and length
    fields, then the byte order's 6 bytes — and ``expect`` what they must be (from ``local``
    and ``order``): one C call instead of two slices and compares a header."""
    expect: tuple[bytes, ...] = ()

    def __post_init__(self) -> None:
        spans: list[slice] = []
        expect: list[bytes] = []
        for at, lengths in self.local:
            spans += [slice(at, at + 4), slice(at + 26, at + 30)]
            expect += [ZIP_LOCAL, lengths]
        if self.order is not None:
            spans.append(slice(self.order, self.order + 6))
            expect.append(b"little")
        spans.append(slice(0, 0))  # ≥ 2 items: itemgetter gives a tuple
        expect.append(b"")
        self.marks = itemgetter(*spans)
        self.expect = tuple(expect)


def _pieces(offset: int, length: int, crcs: tuple[int, ...]) -> Any:
    """``itemgetter`` of a central directory's bytes between its CRC fields (``crcs``: their
    offsets in the directory), the directory at ``offset`` of the file, ``length`` long."""
    spans, start = [], offset
    for at in crcs:
        spans.append(slice(start, offset + at))
        start = offset + at + 4
    spans += [slice(start, offset + length), slice(0, 0)]  # ≥ 2 items: a tuple
    return itemgetter(*spans)


class _Layouts:
    """Small ``torch.save`` files of one dump share a handful of zip layouts: the member
    names, sizes and offsets repeat, only the CRCs and the bytes differ. Parsing each file's
    zip directory and local headers in Python was ~2/3 of a header read (~20 µs of ~30 µs on
    bench case (b)'s 1 808 files); a file laid out like one parsed before takes the offsets
    found then. Reuse asks for exact equality of everything else: the file size, the
    directory's place and every byte of it but the CRC fields, the local headers' signature
    and length fields; ``data.pkl`` is still unpickled (memoised by its bytes) and the byte
    order still read. Anything else (a new layout, zip64, an odd pickle) takes the full parse,
    which raises what it raises. The directory's key is its bytes between the CRC fields,
    taken by one ``itemgetter`` of slices (a zeroed copy of it cost ~2.6 µs a file)."""

    LIMIT = 4096

    def __init__(self) -> None:
        self.crcs: dict[tuple[int, int, int], Any] = {}
        """(file size, directory offset, directory size) → the getter of the directory's
        bytes outside its CRC fields (:func:`_pieces`)."""
        self.known: dict[tuple[tuple[int, int, int], tuple[bytes, ...]], _Layout] = {}
        """(the directory's place, its bytes outside the CRC fields) → layout."""

    @staticmethod
    def _where(head: bytes) -> tuple[int, int, int] | None:
        pos = zip_end_record(head)
        if pos < 0:
            return None
        _, _, _, _, count, length, offset, _ = _EOCD_S.unpack_from(head, pos)
        if offset == 0xFFFFFFFF or count == 0xFFFF or offset + length > pos:
            return None
        return len(head), offset, length

    def locator(self, path: str, head: bytes) -> Locator | None:
        """The locator of a whole small file laid out like one seen before, else None."""
        if not self.known:
            return None
        where = self._where(head)
        pieces = self.crcs.get(where) if where is not None else None
        if pieces is None:
            return None
        layout = self.known.get((where, pieces(head)))  # type: ignore[arg-type]
        if layout is None or layout.marks(head) != layout.expect:
            return None
        start, length = layout.pkl
        try:
            spec, strides, need = _facts(head[start : start + length])
        except LayerwatchError:
            return None
        storage = layout.storages.get(spec.key)
        if storage is None or need > storage[1]:
            return None
        if strides is None and not spec.storage_offset:
            return plain_locator(path, storage[0], storage[1], spec.dtype, spec.shape)
        return Locator(
            path, storage[0], storage[1], spec.dtype, spec.shape, strides, spec.storage_offset
        )

    def learn(
        self,
        head: bytes,
        starts: list[int],
        pkl: tuple[int, int],
        order: int | None,
        key: str,
        storage: tuple[int, int],
        used: list[tuple[int, int]],
    ) -> None:
        """Keep the layout of a whole small file the full parse just read."""
        where = self._where(head)
        if where is None or not starts or where[1] != starts[0]:
            return
        pieces = _pieces(where[1], where[2], tuple(at + 16 for at in starts[1:]))
        if len(self.known) >= self.LIMIT:
            self.known.clear()
            self.crcs.clear()
        self.crcs[where] = pieces
        layout = self.known.setdefault(
            (where, pieces(head)),
            _Layout(pkl, order, {}, tuple((lho, head[lho + 26 : lho + 30]) for lho, _ in used)),
        )
        layout.storages[key] = storage


_LAYOUTS = _Layouts()


# --- the public entry ------------------------------------------------------------------------
def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(out))


def pth_locator(path: str | os.PathLike[str], size: int | None = None) -> Locator:
    """A locator for the tensor in a ``torch.save`` file.

    Raises :class:`PthIncomplete` while the zip framing is incomplete (a file being written),
    :class:`PthRefused` / :class:`LayerwatchError` with a one-line message otherwise.
    """
    spath = os.fspath(path)
    try:
        fd = os.open(spath, os.O_RDONLY)
    except FileNotFoundError:
        raise LayerwatchError(f"{spath}: file not found") from None
    except OSError as exc:
        raise LayerwatchError(f"{spath}: cannot open: {exc.strerror}") from None
    starts: list[int] | None = None
    try:
        if size is None:
            size = os.fstat(fd).st_size
        head = os.pread(fd, size if size <= _SMALL else 4096, 0)
        whole = len(head) == size
        if whole:
            known = _LAYOUTS.locator(spath, head)
            if known is not None:
                HELD.keep(spath, head)  # its payload is sliced from these bytes (load_flat)
                return known
            starts = []
        if head[:4] != ZIP_LOCAL:
            if len(head) < 4 or size == 0:
                raise PthIncomplete(f"{spath}: empty file")
            return _fallback(spath)
        members = _members(spath, fd, size, head, starts)
        pkl_name = next((n for n in members if n.endswith("data.pkl")), None)
        if pkl_name is None:
            raise LayerwatchError(f"{spath}: not a torch.save file (no data.pkl)")
        prefix = pkl_name[: -len("data.pkl")]
        order = members.get(prefix + "byteorder")
        order_at = None
        if order is not None:
            order_at = _data_offset(spath, fd, "byteorder", order, head, size)
            if _pread(fd, order_at, order[1], head, 0) != b"little":
                raise LayerwatchError(f"{spath}: big-endian torch file is not supported")
        pkl = members[pkl_name]
        start = _data_offset(spath, fd, pkl_name, pkl, head, size)
        try:
            spec, strides, need = _facts(_pread(fd, start, pkl[1], head, 0))
        except PthRefused as exc:
            if "refused global torch" in str(exc) or "subclass" in str(exc):
                return _fallback(spath)  # a torch object we do not model: torch's safe loader
            raise PthRefused(f"{spath}: refused to unpickle: {exc}") from None
        storage_name = f"{prefix}data/{spec.key}"
        storage = members.get(storage_name)
        if storage is None:
            raise PthIncomplete(f"{spath}: storage {spec.key} missing")
        data_start = _data_offset(spath, fd, storage_name, storage, head, size)
    finally:
        os.close(fd)
    if need > storage[1]:
        raise LayerwatchError(f"{spath}: tensor view runs past its storage")
    if starts:  # a whole small file: its layout serves every later file laid out alike
        used = [m for m in (order, pkl, storage) if m is not None]
        _LAYOUTS.learn(
            head, starts, (start, pkl[1]), order_at, spec.key, (data_start, storage[1]), used
        )
    if whole:
        HELD.keep(spath, head)
    # spec.dtype is already one of our names (the stand-ins only produce those)
    return Locator(
        spath, data_start, storage[1], spec.dtype, spec.shape, strides, spec.storage_offset
    )


def is_complete_zip(path: str | os.PathLike[str], size: int | None = None) -> bool:
    """Cheap framing check for live reading: the zip's end-of-directory record is parseable."""
    try:
        pth_locator(path, size)
    except PthIncomplete:
        return False
    except LayerwatchError:
        return True  # complete but unreadable: the reader reports it
    return True


# --- fallback through torch's safe loader ------------------------------------------------------
def _cache_dir() -> Path:
    uid = os.getuid() if hasattr(os, "getuid") else 0
    import tempfile  # only on this rare path (hashlib and tempfile cost ~8 ms of start-up)

    path = Path(tempfile.gettempdir()) / f"layerwatch-{uid}" / "pth-cache"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _fallback(path: str) -> Locator:
    """``torch.load(weights_only=True)`` for files the fast path cannot parse; cached as .npy."""
    import numpy as np

    st = os.stat(path)
    import hashlib

    digest = hashlib.sha1(f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}".encode())
    target = _cache_dir() / f"{digest.hexdigest()}.npy"
    meta = target.with_suffix(".dtype")
    if not (target.exists() and meta.exists()):
        import torch  # only here: the legacy format needs torch's own reader

        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise PthRefused(f"{path}: torch.load(weights_only=True) refused it: {first}") from None
        if not isinstance(obj, torch.Tensor):
            raise LayerwatchError(f"{path}: holds a {type(obj).__name__}, not a single tensor")
        tensor = obj.detach().cpu().contiguous()
        dtype = str(tensor.dtype).removeprefix("torch.")
        if tensor.dtype == torch.bfloat16:
            array = tensor.view(torch.int16).numpy().view(np.uint16)
        elif dtype.startswith("float8"):
            array = tensor.view(torch.uint8).numpy()
        else:
            array = tensor.numpy()
        meta.write_text(dtype)
        with replacing(target, unique=True) as tmp, open(tmp, "wb") as fh:
            np.save(fh, array)
    dtype = meta.read_text().strip()
    with open(target, "rb") as fh:
        fmt = np.lib.format
        major, _ = fmt.read_magic(fh)
        read_header = fmt.read_array_header_1_0 if major == 1 else fmt.read_array_header_2_0
        shape, _, _ = read_header(fh)
        offset = fh.tell()
    nbytes = target.stat().st_size - offset
    return Locator(str(target), offset, nbytes, canonical_dtype(dtype), tuple(shape))
