"""The ATB tensor ``.bin`` file (CANN ``Mki::BinFile``): header parse and framing check.

Layout: ASCII ``key=value`` lines, then the raw payload::

    $Version=1.0
    $Object.Count=1
    $Object.Length=<payload bytes>
    format=<aclFormat>
    dtype=<aclDataType>
    dims=<d0>,<d1>,...
    $Object.data=<offset>,<length>
    $End=1
    <payload, C-contiguous little-endian>

The header is found with one ``bytes.find`` and split once (msit walks it byte by byte in
Python); the payload is never copied: the result is a :class:`Locator` at its offset.
Statistics dumps use the same header with ``max min mean l2norm`` keys and no payload.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from layerwatch.capture.errors import LayerwatchError
from layerwatch.capture.framing import atb_fields, atb_header_end

ACL_DTYPES: dict[int, str] = {
    0: "float32", 1: "float16", 2: "int8", 3: "int32", 4: "uint8", 6: "int16", 7: "uint16",
    8: "uint32", 9: "int64", 10: "uint64", 11: "float64", 12: "bool", 16: "complex64",
    17: "complex128", 27: "bfloat16", 35: "float8_e5m2", 36: "float8_e4m3fn",
}  # fmt: skip
"""aclDataType codes we can read (CANN ``acl_base.h``)."""
ACL_UNSUPPORTED: dict[int, str] = {
    13: "string", 29: "int4", 30: "uint1", 33: "complex32", 34: "hifloat8", 37: "float8_e8m0",
    38: "float6_e3m2", 39: "float6_e2m3", 40: "float4_e2m1", 41: "float4_e1m2", 42: "hifloat4",
}  # fmt: skip
FORMAT_ND = 2
NZ_FORMATS = frozenset({29, 50, 51, 52, 53, 54})
"""FRACTAL_NZ, and its explicit-C0 variants (FRACTAL_NZ_C0_16/32/2/4/8)."""
_HEAD = 4096


class BinIncomplete(LayerwatchError):
    """The file is shorter than its header says (still being written)."""


@dataclass(slots=True)
class BinHeader:
    path: str
    attrs: dict[str, str]
    payload_offset: int
    file_size: int
    dtype_code: int = -1
    format: int = FORMAT_ND
    dims: tuple[int, ...] = ()
    length: int = -1
    """``$Object.Length`` (payload bytes), -1 when absent."""
    objects: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def dtype(self) -> str | None:
        """Our dtype name, or ``None`` when the code is not readable (see :meth:`dtype_note`)."""
        return ACL_DTYPES.get(self.dtype_code)

    def dtype_note(self) -> str:
        name = ACL_UNSUPPORTED.get(self.dtype_code, "unknown")
        return f"{self.path}: unsupported dtype {self.dtype_code} ({name}); not compared"

    @property
    def is_stats(self) -> bool:
        return "max" in self.attrs and not self.objects and self.length <= 0

    @property
    def data(self) -> tuple[int, int] | None:
        """(absolute offset, length) of the tensor payload, or ``None`` (description only)."""
        if self.objects:
            off, length = self.objects.get("data") or next(iter(self.objects.values()))
            return self.payload_offset + off, length
        if self.length > 0:
            return self.payload_offset, self.length
        return None


def read_header(path: str | os.PathLike[str], size: int | None = None) -> BinHeader:
    """Parse the header; raise :class:`BinIncomplete` while the file is still being written."""
    spath = os.fspath(path)
    try:
        with open(spath, "rb") as fh:
            if size is None:
                size = os.fstat(fh.fileno()).st_size
            head = fh.read(_HEAD)
            end, payload_at = atb_header_end(head)
            while end < 0 and len(head) < min(size, 1 << 20):
                more = fh.read(_HEAD * 4)
                if not more:
                    break
                head += more
                end, payload_at = atb_header_end(head)
    except FileNotFoundError:
        raise LayerwatchError(f"{spath}: file not found") from None
    except OSError as exc:
        raise LayerwatchError(f"{spath}: cannot read: {exc.strerror}") from None
    if end < 0:
        if len(head) >= 1 << 20 or (head and not head.startswith(b"$")):
            raise LayerwatchError(f"{spath}: not an ATB tensor file (no $End=1 header end)")
        raise BinIncomplete(f"{spath}: header incomplete")
    attrs = atb_fields(head[:end])
    header = BinHeader(spath, attrs, payload_at, size)
    try:
        header.dtype_code = int(attrs.get("dtype", attrs.get("type", "-1")))
        header.format = int(attrs.get("format", FORMAT_ND))
        dims = attrs.get("dims", "")
        header.dims = tuple(int(d) for d in dims.replace(";", ",").split(",") if d.strip())
        header.length = int(attrs.get("$Object.Length", "-1"))
        for key, value in attrs.items():
            if key.startswith("$Object.") and key not in ("$Object.Length", "$Object.Count"):
                off, _, length = value.partition(",")
                header.objects[key[len("$Object.") :]] = (int(off), int(length))
    except ValueError:
        raise LayerwatchError(f"{spath}: malformed ATB header") from None
    data = header.data
    if data is not None and data[0] + data[1] > size:
        raise BinIncomplete(f"{spath}: payload incomplete ({size} of {data[0] + data[1]} bytes)")
    return header


def is_complete_bin(path: str | os.PathLike[str], size: int | None = None) -> bool:
    """Framing check for live reading: header ends with ``$End=1`` and the payload is all there."""
    try:
        read_header(path, size)
    except BinIncomplete:
        return False
    except LayerwatchError:
        return True  # complete but unreadable: the reader reports it
    return True
