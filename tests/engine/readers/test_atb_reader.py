"""ATB .bin dumps (written from the documented CANN BinFile layout): every dtype, NZ, live files."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest
from layerwatch.engine.readers import open_dump
from layerwatch.engine.readers.atb import structural_order
from layerwatch.engine.readers.atb_bin import ACL_DTYPES, is_complete_bin, read_header
from layerwatch.engine.readers.load import itemsize, load_array
from support import atb

from .conftest import FIXTURES

DUMP = FIXTURES / "atb" / "msit_dump_fixture"


def _make_atb():  # the fixture generator holds the arrays it wrote
    spec = importlib.util.spec_from_file_location("make_atb", FIXTURES / "make_atb.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_fixture_values_every_dtype_and_nz() -> None:
    make_atb = _make_atb()
    update = open_dump(DUMP).poll()
    assert update.token_ids == {0: (11, 42, 7, 93), 1: (92,)}
    seen_dtypes = set()
    for record in update.tensors:
        rel = Path(record.source).relative_to(DUMP / "tensors" / "0_4242" / str(record.key.token))
        expected = make_atb.expected(record.key.token)[str(rel)]
        got = load_array(record.loc)
        seen_dtypes.add(record.dtype)
        if rel.parts[0] == "3_NzNoShape":
            assert record.loc.layout == "nz" and got.shape == (32, 32)
            np.testing.assert_array_equal(got, expected)  # aligned: padding-free un-blocking
            continue
        assert got.shape == expected.shape == record.shape
        np.testing.assert_array_equal(got, expected)
    assert seen_dtypes == set(ACL_DTYPES.values()) - {"float8_e5m2", "float8_e4m3fn"}
    linear_w = next(
        r
        for r in update.tensors
        if r.key.node.endswith("1_LinearOperation") and r.key.stem == "input_1"
    )
    assert (
        linear_w.loc.layout == "nz"
        and linear_w.loc.stored_shape == (1, 2, 48, 16)
        and linear_w.shape == (48, 32)
    )
    notes = "\n".join(update.notes)
    assert notes.count("unsupported dtype 29 (int4)") == 2
    assert notes.count("FRACTAL_NZ tensor with unknown ND shape") == 2


def test_fixture_names_order_and_topology() -> None:
    update = open_dump(DUMP).poll()
    keys = {(r.key.token, r.key.node, r.key.stem) for r in update.tensors}
    assert (0, "root.1_Decoder.1_LinearOperation", "input_1") in keys
    assert (1, "root.0_WordEmbedding", "output_0") in keys
    order = {r.key.node: r.order for r in update.tensors if r.key.token == 0}
    assert order["root.0_WordEmbedding.0_GatherOperation"] < order["root.0_WordEmbedding"]
    assert order["root.0_WordEmbedding"] < order["root.1_Decoder.0_RmsNormOperation"]
    assert (
        order["root.1_Decoder.1_LinearOperation"]
        < order["root.1_Decoder"]
        < order["root.2_DtypeZoo"]
    )
    topo = update.topology
    assert topo is not None
    assert topo.nodes["root.1_Decoder.1_LinearOperation"].parent == "root.1_Decoder"
    assert topo.nodes["root.1_Decoder"].type == "Decoder"
    # Every accepted entry point finds the same tensors.
    n = len(update.tensors)
    assert len(open_dump(DUMP / "tensors").poll().tensors) == n
    assert len(open_dump(DUMP / "tensors" / "0_4242").poll().tensors) == n
    assert {r.key.token for r in open_dump(DUMP / "tensors" / "0_4242" / "1").poll().tensors} == {1}


def test_structural_order_is_post_order() -> None:
    paths = [["0_A", "0_B"], ["0_A", "1_C", "0_D"], ["0_A", "1_C"], ["0_A"], ["1_E"], ["10_F"]]
    keys = [structural_order(p) for p in paths]
    assert keys == sorted(keys)


def test_header_parse_and_partial_files(tmp_path: Path) -> None:
    path = tmp_path / "t.bin"
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    atb.write_bin(path, arr)
    header = read_header(path)
    assert header.dims == (3, 4) and header.dtype == "float32" and header.length == 48
    data = path.read_bytes()
    for cut in (5, data.index(b"$End") + 3, len(data) - 1):
        path.write_bytes(data[:cut])
        assert not is_complete_bin(path)
    path.write_bytes(data)
    assert is_complete_bin(path)


def test_live_files_before_after_and_odd_files(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    x, y = (
        rng.standard_normal((2, 8)).astype(np.float32),
        rng.standard_normal((2, 8)).astype(np.float16),
    )
    op = tmp_path / "tensors" / "1_77" / "0" / "0_LinearOperation"
    op.mkdir(parents=True)
    reader = open_dump(tmp_path / "tensors" / "1_77")
    full = atb.bin_bytes(x.tobytes(), 0, x.shape)
    p_in = op / "before" / "intensor0.bin"
    p_in.parent.mkdir()
    p_in.write_bytes(full[:-7])  # payload not all there yet
    assert reader.poll([p_in]).tensors == []
    p_in.write_bytes(full)
    (retried,) = reader.poll([]).tensors  # no new event needed: pending files are retried
    assert retried.key.stem == "input_0"
    atb.write_bin(op / "after" / "intensor0.bin", x + 1)  # after/ input: before/ wins
    atb.write_bin(op / "after" / "outtensor0.bin", y)
    (op / "after" / "outtensor1.bin").write_bytes(
        atb.bin_bytes(None, 1, (2, 8))
    )  # description only
    (op / "after" / "outtensor2.bin").write_bytes(
        atb.bin_bytes(
            None, 1, (2, 8), extra={"max": "3.5", "min": "-1", "mean": "0.25", "l2norm": "9"}
        )
    )  # a statistics file
    update = reader.poll([op / "before" / "intensor0.bin", op / "after"])
    got = {r.key.stem: r for r in update.tensors} | {"input_0": retried}
    assert set(got) == {"input_0", "output_0", "output_2"}
    np.testing.assert_array_equal(load_array(got["input_0"].loc), x)
    np.testing.assert_array_equal(load_array(got["output_0"].loc), y)
    assert got["output_2"].loc is None and got["output_2"].stats.max == 3.5
    assert any("description only" in n for n in update.notes)
    assert reader.poll().tensors == []  # nothing twice
    shutil.rmtree(tmp_path / "tensors")
    assert any("disappeared" in n for n in reader.poll().notes)


def test_non_preferred_copy_waits_for_the_preferred_one(tmp_path: Path) -> None:
    x = np.arange(8, dtype=np.float32)
    op = tmp_path / "tensors" / "0_1" / "0" / "0_Add"
    (op / "before").mkdir(parents=True)
    before = op / "before" / "intensor0.bin"
    data = atb.bin_bytes(x.tobytes(), 0, x.shape)
    before.write_bytes(data[:-4])  # header written, payload coming
    reader = open_dump(tmp_path)
    assert reader.poll().tensors == []
    atb.write_bin(op / "after" / "intensor0.bin", x * 7)  # the op already ran in place
    assert reader.poll([op / "after" / "intensor0.bin"]).tensors == []
    before.write_bytes(data)
    (record,) = reader.poll([before]).tensors
    np.testing.assert_array_equal(load_array(record.loc), x)
    assert reader.poll().tensors == []


def test_nd_shape_can_be_given(tmp_path: Path) -> None:
    nd = np.random.default_rng(0).standard_normal((20, 40)).astype(np.float16)
    out = tmp_path / "tensors" / "0_1" / "0" / "0_MatMul" / "before" / "intensor1.bin"
    atb.write_bin(out, atb.to_nz(nd), fmt=atb.FORMAT_NZ)
    reader = open_dump(tmp_path, nd_shapes={"root.0_MatMul:input_1": (20, 40)})
    (record,) = reader.poll().tensors
    assert record.shape == (20, 40) and record.loc.stored_shape == (1, 3, 32, 16)
    np.testing.assert_array_equal(load_array(record.loc), nd)


@pytest.mark.parametrize("code", sorted(ACL_DTYPES))
def test_every_readable_dtype_code(tmp_path: Path, code: int) -> None:
    name = ACL_DTYPES[code]
    raw = np.random.default_rng(code).integers(0, 256, 48, dtype=np.uint8)
    if name == "bool":
        raw = raw % 2
    n = 48 // itemsize(name)
    path = tmp_path / "tensors" / "0_1" / "0" / "0_Op" / "after" / "outtensor0.bin"
    path.parent.mkdir(parents=True)
    path.write_bytes(atb.bin_bytes(raw.tobytes(), code, (n,)))
    (record,) = open_dump(tmp_path).poll().tensors
    assert record.dtype == name and record.shape == (n,)
    assert load_array(record.loc).shape == (n,)
