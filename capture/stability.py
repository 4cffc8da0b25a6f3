"""Is a file that someone else is writing complete yet? Framing checks per format.

Our own writer renames finished files into place, so a rename is proof enough. Foreign writers
(msit's ``torch.save`` of ``.pth``, the CANN probe's ATB ``.bin``, msprobe's ``dump.json`` and
``.pt``) write in place: the watcher asks :func:`check_file` and hands the engine a file only
when its own framing says it is whole. Each check reads a few hundred bytes (the whole file
only for JSON), so it can run on every close/rename event and again on a timer. The framing
rules shared with the engine's readers (zip end record, ATB header) are capture/framing.py's.
"""

from __future__ import annotations

import ast
import json
import os
import struct
from dataclasses import dataclass
from enum import Enum
from math import prod
from pathlib import Path

from .framing import (
    ACL_ITEMSIZE,
    ZIP_EOCD_LEN,
    ZIP_LOCAL,
    atb_fields,
    atb_header_end,
    zip64_locator,
    zip_end_record,
)


class Completeness(str, Enum):
    COMPLETE = "complete"
    """The file's framing says every byte is there."""
    INCOMPLETE = "incomplete"
    """The framing says more bytes are due (or the file cannot be parsed yet)."""
    UNKNOWN = "unknown"
    """No framing rule for this kind of file: rely on close/rename events or a stable size."""


@dataclass(frozen=True, slots=True)
class Check:
    state: Completeness
    size: int
    reason: str = ""
    """Why the file is not complete, in words (``"412 of 4096 bytes"``)."""


_ZIP_SUFFIXES = (".pth", ".pt")
_ATB_HEADER_MAX = 1 << 16
_NPY_MAGIC = b"\x93NUMPY"
_JSON_MAX = 1 << 30
"""Bigger JSON files are not parsed to check them (msprobe's dump.json is MBs, not GBs)."""


def check_file(path: str | os.PathLike[str]) -> Check:
    """Check ``path`` by its suffix; a missing file is INCOMPLETE (it may be renamed in later)."""
    path = os.fspath(path)
    try:
        size = os.stat(path).st_size
        name = path.rsplit("/", 1)[-1].lower()
        if name.endswith(_ZIP_SUFFIXES):
            return _check_zip(path, size)
        if name.endswith(".bin"):
            return _check_atb_bin(path, size)
        if name.endswith(".safetensors"):
            return _check_safetensors(path, size)
        if name.endswith(".json"):
            return _check_json(path, size)
        if name.endswith(".npy"):
            return _check_npy(path, size)
        return Check(Completeness.UNKNOWN, size)
    except FileNotFoundError:
        return Check(Completeness.INCOMPLETE, 0, "the file is gone")
    except OSError as exc:
        return Check(Completeness.INCOMPLETE, 0, f"cannot read it: {exc.strerror or exc}")


def _read(path: str, offset: int, length: int) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read(length)


def _short(size: int, expected: int) -> Check:
    if size >= expected:
        return Check(Completeness.COMPLETE, size)
    return Check(Completeness.INCOMPLETE, size, f"{size} of {expected} bytes")


def _check_zip(path: str, size: int) -> Check:
    """torch.save's zip: complete once the end-of-central-directory record closes the file."""
    if size < ZIP_EOCD_LEN:
        return Check(Completeness.INCOMPLETE, size, f"{size} bytes, no zip directory yet")
    if _read(path, 0, 4) != ZIP_LOCAL:
        # Legacy (pre-1.6) torch.save is a bare pickle stream: no framing to check.
        return Check(Completeness.UNKNOWN, size)
    tail_len = min(size, ZIP_EOCD_LEN + 0xFFFF)
    tail = _read(path, size - tail_len, tail_len)
    pos = zip_end_record(tail)
    if pos >= 0:
        return _check_central_dir(tail, pos, size - tail_len + pos, size)
    return Check(Completeness.INCOMPLETE, size, f"{size} bytes, zip directory not written yet")


def _check_central_dir(tail: bytes, pos: int, eocd_at: int, size: int) -> Check:
    cd_size, cd_offset = struct.unpack_from("<II", tail, pos + 12)
    if cd_offset == 0xFFFFFFFF or cd_size == 0xFFFFFFFF:
        # ZIP64: the real values sit in the zip64 record; its locator precedes the EOCD.
        ok = zip64_locator(tail, pos) >= 0
        return Check(
            Completeness.COMPLETE if ok else Completeness.INCOMPLETE,
            size,
            "" if ok else "bad zip64 directory",
        )
    if cd_offset + cd_size > eocd_at:
        return Check(Completeness.INCOMPLETE, size, "zip directory points past the end")
    return Check(Completeness.COMPLETE, size)


def _check_atb_bin(path: str, size: int) -> Check:
    """ATB ``.bin``: ``key=value`` header lines up to ``$End=1``, then the payload."""
    head = _read(path, 0, min(size, _ATB_HEADER_MAX))
    if head.startswith(ZIP_LOCAL):
        return _check_zip(path, size)  # e.g. a torch.save'd pytorch_model.bin
    end, header_len = atb_header_end(head)
    if end < 0:
        if size >= _ATB_HEADER_MAX or not _looks_like_header(head):
            return Check(Completeness.UNKNOWN, size)  # not an ATB tensor file
        return Check(Completeness.INCOMPLETE, size, f"{size} bytes, header not finished")
    fields = atb_fields(head[:end])
    payload = _atb_payload_len(fields)
    if payload is None:
        return Check(Completeness.COMPLETE, size)  # statistics .bin: the header is the file
    return _short(size, header_len + payload)


def _looks_like_header(head: bytes) -> bool:
    """Printable ``key=value`` lines so far (the last one may still be cut short)."""
    if any(b != 10 and not 32 <= b < 127 for b in head):
        return False
    return all(b"=" in line for line in head.split(b"\n")[:-1])


def _atb_payload_len(fields: dict[str, str]) -> int | None:
    if "$Object.Length" in fields:
        return int(fields["$Object.Length"])
    ends = []
    for key, value in fields.items():
        if (
            key.startswith("$Object.")
            and key not in ("$Object.Count", "$Object.Length")
            and "," in value
        ):
            offset, length = value.split(",", 1)
            ends.append(int(offset) + int(length))
    if ends:
        return max(ends)
    if "dims" in fields and "dtype" in fields:
        dims = [int(d) for d in fields["dims"].split(",") if d.strip()]
        return prod(dims) * ACL_ITEMSIZE.get(int(fields["dtype"]), 1)
    return None


def _check_safetensors(path: str, size: int) -> Check:
    if size < 8:
        return Check(Completeness.INCOMPLETE, size, f"{size} bytes, header not written yet")
    (header_len,) = struct.unpack("<Q", _read(path, 0, 8))
    if size < 8 + header_len:
        return Check(Completeness.INCOMPLETE, size, f"{size} bytes, header not written yet")
    try:
        header = json.loads(_read(path, 8, header_len))
    except ValueError:
        return Check(Completeness.INCOMPLETE, size, "header is not valid JSON")
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    return _short(size, 8 + header_len + max(ends, default=0))


def _check_json(path: str, size: int) -> Check:
    if size == 0:
        return Check(Completeness.INCOMPLETE, 0, "empty")
    if size > _JSON_MAX:
        return Check(Completeness.UNKNOWN, size)
    try:
        json.loads(Path(path).read_bytes())  # msprobe writes bare NaN/Infinity: accepted here
    except ValueError:
        return Check(Completeness.INCOMPLETE, size, f"{size} bytes, not parseable JSON yet")
    return Check(Completeness.COMPLETE, size)


def _check_npy(path: str, size: int) -> Check:
    head = _read(path, 0, min(size, 1 << 16))
    if len(head) < 10 or not head.startswith(_NPY_MAGIC):
        return Check(Completeness.INCOMPLETE, size, "header not written yet")
    major = head[6]
    if major == 1:
        (hlen,), start = struct.unpack_from("<H", head, 8), 10
    else:
        if len(head) < 12:
            return Check(Completeness.INCOMPLETE, size, "header not written yet")
        (hlen,), start = struct.unpack_from("<I", head, 8), 12
    if len(head) < start + hlen:
        return Check(Completeness.INCOMPLETE, size, "header not written yet")
    try:
        meta = ast.literal_eval(head[start : start + hlen].decode("latin1"))
        itemsize = int("".join(ch for ch in str(meta["descr"]) if ch.isdigit()) or 1)
        expected = start + hlen + prod(meta["shape"]) * itemsize
    except (ValueError, SyntaxError, KeyError, TypeError):
        return Check(Completeness.UNKNOWN, size)  # structured dtypes etc.: fall back
    return _short(size, expected)
