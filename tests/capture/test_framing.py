"""capture/framing.py: one set of framing rules, so the watcher and the readers agree on when
a file someone is still writing is whole (real torch.save zips and ATB .bin files, cut short)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from layerwatch.capture.framing import (
    atb_fields,
    atb_header_end,
    whole_lines,
    zip64_locator,
    zip_end_record,
)
from layerwatch.capture.stability import Completeness, check_file
from layerwatch.engine.readers.atb_bin import is_complete_bin
from layerwatch.engine.readers.pth import is_complete_zip
from support.atb import write_bin


def _agree(path: Path, reader_says_whole, tmp_path: Path) -> int:  # type: ignore[no-untyped-def]
    """At every prefix length, the watcher's check and the reader agree; returns cuts judged."""
    data = path.read_bytes()
    judged = 0
    for cut in range(len(data) + 1):
        partial = tmp_path / f"cut{path.suffix}"
        partial.write_bytes(data[:cut])
        state = check_file(partial).state
        if state is Completeness.UNKNOWN:
            continue  # no framing seen yet: the watcher waits for a close event instead
        assert (state is Completeness.COMPLETE) == reader_says_whole(partial), (cut, len(data))
        judged += 1
    assert check_file(path).state is Completeness.COMPLETE and reader_says_whole(path)
    return judged


def test_watcher_and_pth_reader_agree_on_a_torch_zip(tmp_path: Path) -> None:
    path = tmp_path / "output.pth"
    torch.save(torch.arange(64, dtype=torch.float32), path)
    assert _agree(path, is_complete_zip, tmp_path) > len(path.read_bytes()) // 2


@pytest.mark.parametrize("mark", [b"$End=1\n", b"$END=1\n"])
def test_watcher_and_atb_reader_agree_on_a_bin(tmp_path: Path, mark: bytes) -> None:
    path = write_bin(tmp_path / "outtensor0.bin", np.arange(24, dtype=np.float32))
    path.write_bytes(path.read_bytes().replace(b"$End=1\n", mark))
    assert _agree(path, is_complete_bin, tmp_path) > 96


def test_zip_end_record_must_close_the_file(tmp_path: Path) -> None:
    path = tmp_path / "x.pth"
    torch.save(torch.ones(3), path)
    data = path.read_bytes()
    eocd = zip_end_record(data)
    assert eocd == len(data) - 22
    assert zip64_locator(data, eocd) == eocd - 20  # torch.save always writes zip64 records
    assert zip64_locator(data[eocd:], 0) == -1
    assert zip_end_record(data + b"\0") == -1  # a record that does not end the file
    assert zip_end_record(data[:-1]) == -1


def test_atb_header_end_counts_only_a_whole_line() -> None:
    assert atb_header_end(b"dims=2\n$End=1\nPAYLOAD") == (7, 14)
    assert atb_header_end(b"note=x$End=1\n") == (-1, -1)
    assert atb_header_end(b"dims=2\n$End=1") == (-1, -1)  # the mark's newline not written yet
    assert atb_fields(b"$Object.Length=8\n dtype = 27 \njunk\n") == {
        "$Object.Length": "8",
        "dtype": "27",
    }


def test_whole_lines() -> None:
    assert whole_lines(b"") == 0
    assert whole_lines(b'{"k":"t"') == 0
    assert whole_lines(b'{"a":1}\n{"b":') == 8
    assert whole_lines(b"a\nb\n") == 4


def test_the_watchers_element_sizes_are_the_readers() -> None:
    from layerwatch.capture.framing import ACL_ITEMSIZE
    from layerwatch.engine.readers.atb_bin import ACL_DTYPES
    from layerwatch.engine.readers.load import itemsize

    assert {code: itemsize(name) for code, name in ACL_DTYPES.items()} == ACL_ITEMSIZE
