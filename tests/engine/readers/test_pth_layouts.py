"""Reused zip layouts of small .pth files (engine/readers/pth.py ``_Layouts``): a file laid out
like one parsed before gets the locator the full parse gives, and anything that differs from
the learned layout (bytes outside the CRCs, local headers, byte order, the pickle) is parsed
in full again, with the full parse's result or error."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.readers import open_dump, pth
from layerwatch.engine.readers.pth import pth_locator

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "msit"


@pytest.fixture(autouse=True)
def fresh_layouts() -> Iterator[None]:
    pth._LAYOUTS.known.clear()
    pth._LAYOUTS.crcs.clear()
    yield
    pth._LAYOUTS.known.clear()
    pth._LAYOUTS.crcs.clear()


def full_parse(path: Path) -> object:
    """The locator (or the error) of the full parse, with no layout to reuse."""
    saved = (dict(pth._LAYOUTS.known), dict(pth._LAYOUTS.crcs))
    pth._LAYOUTS.known.clear()
    pth._LAYOUTS.crcs.clear()
    try:
        return pth_locator(path)
    except LayerwatchError as exc:
        return (type(exc), str(exc))
    finally:
        pth._LAYOUTS.known.clear()
        pth._LAYOUTS.crcs.clear()
        pth._LAYOUTS.known.update(saved[0])
        pth._LAYOUTS.crcs.update(saved[1])


def reused(path: Path) -> object:
    try:
        return pth_locator(path)
    except LayerwatchError as exc:
        return (type(exc), str(exc))


TENSORS = {
    "f32": lambda: torch.randn(4, 8),
    "f32_other_shape": lambda: torch.randn(8, 4),
    "bf16": lambda: torch.randn(32).bfloat16(),
    "f16_transposed": lambda: torch.randn(6, 5).half().t(),
    "i64_slice": lambda: torch.arange(40)[3:33:3],
    "bool": lambda: torch.rand(9) > 0.5,
    "scalar": lambda: torch.tensor(2.5),
    "empty": lambda: torch.zeros(0, 3),
}


def test_second_file_of_a_layout_skips_the_directory_and_equals_the_full_parse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    paths: dict[str, list[Path]] = {}
    for name, make in TENSORS.items():
        for copy in range(3):  # same layout, other values: only the CRCs differ
            path = tmp_path / f"{name}_{copy}" / "output.pth"
            path.parent.mkdir()
            torch.save(make(), path)
            paths.setdefault(name, []).append(path)
    want = {p: full_parse(p) for group in paths.values() for p in group}
    for group in paths.values():
        assert reused(group[0]) == want[group[0]]  # learns the layout
    assert pth._LAYOUTS.known

    def no_directory(*args: object, **kwargs: object) -> None:
        raise AssertionError("the zip directory was parsed again")

    monkeypatch.setattr(pth, "_members", no_directory)
    for group in paths.values():
        for path in group[1:]:
            assert reused(path) == want[path]


def test_every_fixture_dump_file_gets_the_full_parse_locator() -> None:
    """The msit fixture dumps (real torch.save files): records equal with and without reuse."""
    for side in ("golden", "target"):
        path = FIXTURES / side
        full = []
        for record in open_dump(path).poll(None, final=True).tensors:
            full.append((record.key, full_parse(Path(record.source))))
        pth._LAYOUTS.known.clear()
        pth._LAYOUTS.crcs.clear()
        records = open_dump(path).poll(None, final=True).tensors
        assert [(r.key, r.loc) for r in records] == full
        assert pth._LAYOUTS.known  # the reader's own calls learned and reused layouts


def _learned_copy(tmp_path: Path, name: str) -> tuple[Path, bytearray]:
    first = tmp_path / "first.pth"
    torch.save(torch.arange(24, dtype=torch.float32).reshape(4, 6), first)
    assert not isinstance(reused(first), tuple)
    copy = tmp_path / name
    shutil.copy(first, copy)
    return copy, bytearray(copy.read_bytes())


def test_a_changed_byte_order_is_refused_as_by_the_full_parse(tmp_path: Path) -> None:
    copy, data = _learned_copy(tmp_path, "order.pth")
    at = data.index(b"little")
    data[at : at + 6] = b"LITTLE"
    copy.write_bytes(bytes(data))
    assert reused(copy) == full_parse(copy)
    with pytest.raises(LayerwatchError, match="big-endian"):
        pth_locator(copy)


def test_changed_local_header_lengths_take_the_full_parse(tmp_path: Path) -> None:
    copy, data = _learned_copy(tmp_path, "local.pth")
    lho = data.index(b"PK\x03\x04", 1)  # the second member's local header
    data[lho + 28] = (data[lho + 28] + 4) % 256  # its extra field length
    copy.write_bytes(bytes(data))
    assert reused(copy) == full_parse(copy)


def test_a_changed_pickle_is_parsed_again(tmp_path: Path) -> None:
    copy, data = _learned_copy(tmp_path, "pickle.pth")
    at = data.index(b"_rebuild_tensor_v2")
    data[at : at + 18] = b"_rebuild_tensor_v9"  # same length: the directory is unchanged
    copy.write_bytes(bytes(data))
    got = reused(copy)
    assert got == full_parse(copy)
    assert isinstance(got, tuple) and "refused" in got[1]


def test_a_changed_directory_byte_outside_the_crcs_is_a_new_layout(tmp_path: Path) -> None:
    copy, data = _learned_copy(tmp_path, "directory.pth")
    cd = data.index(b"PK\x01\x02")
    data[cd + 12] ^= 0x01  # the first record's modification time
    copy.write_bytes(bytes(data))
    assert reused(copy) == full_parse(copy)
    assert len(pth._LAYOUTS.known) == 2


def test_a_reused_locator_has_the_full_parse_fields_and_types(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reuse builds a plain view slot by slot (``records.plain_locator``) and a strided or
    offset view with the constructor: either way every field, and its type, is the full
    parse's."""
    torch.manual_seed(1)
    for name, make in TENSORS.items():
        first, second = tmp_path / name / "a" / "output.pth", tmp_path / name / "b" / "output.pth"
        first.parent.mkdir(parents=True)
        second.parent.mkdir()
        torch.save(make(), first)
        torch.save(make(), second)
        want = full_parse(second)
        assert not isinstance(reused(first), tuple)
        with monkeypatch.context() as m:
            m.setattr(pth, "_members", None)  # the reuse, not the full parse
            got = reused(second)
        assert got == want and hash(got) == hash(want) and repr(got) == repr(want)
        for field in dataclasses.fields(got):  # type: ignore[arg-type]
            assert type(getattr(got, field.name)) is type(getattr(want, field.name))
