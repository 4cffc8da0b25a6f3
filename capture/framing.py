"""Where a file says it ends: the framing rules of the formats layerwatch reads while they grow.

Two parts ask the same questions of a file someone else is writing — the watchers, before they
hand a file over (capture/stability.py), and the engine's readers, before they parse it
(engine/readers/pth.py, atb_bin.py, layerwatch.py, msit.py) — so the answers live here once:
the zip end record that closes a ``torch.save`` file, the ``$End=1`` line that ends an ATB
``.bin`` header and its ``key=value`` fields, and the whole lines of an append-only text file.
Plain bytes in, offsets out: no I/O, no numpy, no engine import (the engine may import this).
"""

from __future__ import annotations

import struct

ZIP_LOCAL = b"PK\x03\x04"
"""A zip (``torch.save`` since 1.6) starts with a local file header."""
ZIP_EOCD = b"PK\x05\x06"
ZIP_EOCD_LEN = 22
"""The end-of-central-directory record, without its trailing comment."""
ZIP64_LOCATOR = b"PK\x06\x07"
ZIP64_LOCATOR_LEN = 20

ATB_END_MARKS = (b"$End=1\n", b"$END=1\n")
"""The line that ends an ATB ``.bin`` header (CANN writes ``$End``; some tools ``$END``)."""
ACL_ITEMSIZE: dict[int, int] = {
    0: 4, 1: 2, 2: 1, 3: 4, 4: 1, 6: 2, 7: 2, 8: 4, 9: 8, 10: 8, 11: 8, 12: 1, 16: 8, 17: 16,
    27: 2, 35: 1, 36: 1,
}  # fmt: skip
"""Bytes per element of each aclDataType code the ATB reader can read (engine/readers/atb_bin.py
names them): a header with only ``dims`` and ``dtype`` says its payload length through these."""


def zip_end_record(tail: bytes) -> int:
    """Offset in ``tail`` (the last bytes of a file) of the end-of-central-directory record
    that closes the file — its comment runs exactly to the end — or -1 while there is none.

    A record found earlier in the tail that does not reach the end is a payload that happens
    to hold the signature, not the end of the zip.
    """
    pos = tail.rfind(ZIP_EOCD)
    while pos >= 0:
        if pos + ZIP_EOCD_LEN <= len(tail):
            (comment_len,) = struct.unpack_from("<H", tail, pos + 20)
            if pos + ZIP_EOCD_LEN + comment_len == len(tail):
                return pos
        pos = tail.rfind(ZIP_EOCD, 0, pos)
    return -1


def zip64_locator(tail: bytes, eocd: int) -> int:
    """Offset of the zip64 locator that must precede the end record at ``eocd``, or -1."""
    at = eocd - ZIP64_LOCATOR_LEN
    return at if at >= 0 and tail[at : at + 4] == ZIP64_LOCATOR else -1


def atb_header_end(head: bytes) -> tuple[int, int]:
    """(offset of the ``$End=1`` line, offset of the payload) in the first bytes of an ATB
    ``.bin``, or ``(-1, -1)`` while the header is not finished. The mark counts only at the
    start of a line (a value cannot end the header)."""
    for mark in ATB_END_MARKS:
        at = head.find(mark)
        if at >= 0 and (at == 0 or head[at - 1 : at] == b"\n"):
            return at, at + len(mark)
    return -1, -1


def atb_fields(header: bytes) -> dict[str, str]:
    """The ``key=value`` lines of an ATB header (the bytes before ``$End=1``), stripped."""
    fields: dict[str, str] = {}
    for line in header.decode("utf-8", "replace").split("\n"):
        key, sep, value = line.partition("=")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def whole_lines(chunk: bytes) -> int:
    """How many leading bytes of ``chunk`` are whole lines (0 while the first is unfinished):
    a writer appends a line with one ``write()``, so only a newline proves a line complete."""
    return chunk.rfind(b"\n") + 1
