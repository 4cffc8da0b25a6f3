"""engine.load: raw bytes at an offset → numpy, on real files, for every dtype and layout."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.readers.load import canonical_dtype, iter_chunks, load_array, load_flat
from layerwatch.engine.records import Locator

NUMPY_DTYPES = {
    "float32": np.float32,
    "float16": np.float16,
    "float64": np.float64,
    "int8": np.int8,
    "uint8": np.uint8,
    "int16": np.int16,
    "uint16": np.uint16,
    "int32": np.int32,
    "uint32": np.uint32,
    "int64": np.int64,
    "uint64": np.uint64,
    "bool": np.bool_,
    "complex64": np.complex64,
    "complex128": np.complex128,
}


def _write(path: Path, payload: bytes, prefix: int = 0) -> Locator:
    """Write ``prefix`` junk bytes then the payload; return a locator skeleton."""
    path.write_bytes(b"\xab" * prefix + payload + b"\xcd" * 7)
    return Locator(str(path), prefix, len(payload), "float32", ())


def _loc(base: Locator, dtype: str, shape: tuple[int, ...], **kw: object) -> Locator:
    return Locator(base.path, base.offset, base.nbytes, dtype, shape, **kw)  # type: ignore[arg-type]


def _bf16_reference(bits: np.ndarray) -> np.ndarray:
    """bf16 bits → float32 through torch (an independent implementation)."""
    import torch

    t = torch.from_numpy(bits.astype(np.int16).copy()).view(torch.bfloat16)
    return t.float().numpy()


shapes = st.lists(st.integers(0, 5), min_size=0, max_size=4).map(tuple)


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(sorted(NUMPY_DTYPES)),
    shape=shapes,
    prefix=st.integers(0, 37),
    seed=st.integers(0, 2**31 - 1),
)
def test_every_dtype_round_trips(
    tmp_path_factory: pytest.TempPathFactory,
    dtype: str,
    shape: tuple[int, ...],
    prefix: int,
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    raw = rng.integers(
        0, 256, size=math.prod(shape) * np.dtype(NUMPY_DTYPES[dtype]).itemsize, dtype=np.uint8
    )
    expected = raw.view(NUMPY_DTYPES[dtype]) if dtype != "bool" else (raw % 2).astype(np.bool_)
    expected = expected.reshape(shape)
    path = tmp_path_factory.mktemp("rt") / "t.bin"
    loc = _loc(_write(path, expected.tobytes(), prefix), dtype, shape)
    got = load_array(loc)
    assert got.dtype == expected.dtype
    assert got.shape == shape
    assert got.tobytes() == expected.tobytes()  # bit-exact, NaN payloads too
    chunks = list(iter_chunks(loc, 3))
    assert all(0 < c.size <= 3 for c in chunks)
    joined = np.concatenate(chunks) if chunks else np.empty(0, expected.dtype)
    assert joined.dtype == expected.dtype
    assert joined.tobytes() == expected.tobytes()


@settings(max_examples=30, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**31 - 1))
def test_bfloat16_widens_exactly(
    tmp_path_factory: pytest.TempPathFactory, shape: tuple[int, ...], seed: int
) -> None:
    bits = np.random.default_rng(seed).integers(0, 1 << 16, size=math.prod(shape), dtype=np.uint16)
    path = tmp_path_factory.mktemp("bf") / "t.bin"
    loc = _loc(_write(path, bits.astype("<u2").tobytes(), 5), "bfloat16", shape)
    got = load_array(loc)
    assert got.dtype == np.float32 and got.shape == shape
    ref = _bf16_reference(bits).reshape(shape)
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))


def test_as_float_widens_half_and_ints(tmp_path: Path) -> None:
    h = np.array([1.5, -2.25, 65504], np.float16)
    loc = _loc(_write(tmp_path / "h.bin", h.tobytes()), "torch.float16", (3,))
    assert load_array(loc).dtype == np.float16
    widened = load_array(loc, as_float=True)
    assert widened.dtype == np.float32
    np.testing.assert_array_equal(widened, h.astype(np.float32))
    i = np.array([2**53, -3], np.int64)
    loc = _loc(_write(tmp_path / "i.bin", i.tobytes()), "int64", (2,))
    assert load_array(loc).dtype == np.int64
    assert load_array(loc, as_float=True).tolist() == [2.0**53, -3.0]


def test_fp8_tables_decode_known_values(tmp_path: Path) -> None:
    # e4m3fn: 0x38 = 1.0, 0x7e = 448 (max), 0x7f = NaN; e5m2: 0x3c = 1.0, 0x7c = inf.
    loc = _loc(_write(tmp_path / "a.bin", bytes([0x38, 0x7E, 0x7F, 0xB8])), "float8_e4m3fn", (4,))
    got = load_array(loc)
    assert got[0] == 1.0 and got[1] == 448.0 and np.isnan(got[2]) and got[3] == -1.0
    loc = _loc(_write(tmp_path / "b.bin", bytes([0x3C, 0x7C, 0x01])), "float8_e5m2", (3,))
    got = load_array(loc)
    assert got[0] == 1.0 and np.isposinf(got[1]) and got[2] == 2.0**-16


def test_strided_views_match_numpy(tmp_path: Path) -> None:
    storage = np.arange(7 * 12, dtype=np.float32)
    loc = _write(tmp_path / "s.bin", storage.tobytes(), 11)
    # A transposed [12, 5] view of a [7, 12] buffer, starting at element 12 (row 1).
    view = storage[12:].reshape(-1)[: 6 * 12].reshape(6, 12)[:5].T
    strided = _loc(loc, "float32", (12, 5), strides=(1, 12), elem_offset=12)
    got = load_array(strided)
    assert got.flags.c_contiguous
    np.testing.assert_array_equal(got, view)
    for max_elems in (1, 4, 7, 12, 59, 1000):
        chunks = list(iter_chunks(strided, max_elems))
        assert all(c.size <= max_elems for c in chunks)
        np.testing.assert_array_equal(np.concatenate(chunks), view.reshape(-1))
    # A 3-D strided slice with an expanded (stride 0) dimension.
    view3 = np.lib.stride_tricks.as_strided(storage[3:], (2, 4, 3), (4 * 24, 0, 4 * 5))
    s3 = _loc(loc, "float32", (2, 4, 3), strides=(24, 0, 5), elem_offset=3)
    np.testing.assert_array_equal(load_array(s3), view3)
    np.testing.assert_array_equal(np.concatenate(list(iter_chunks(s3, 5))), view3.reshape(-1))
    for located, want in ((strided, view), (s3, view3)):  # load_flat: the small-pair reader
        np.testing.assert_array_equal(load_flat(located), want.reshape(-1))


def test_strided_bfloat16(tmp_path: Path) -> None:
    bits = np.arange(0x3F80, 0x3F80 + 24, dtype=np.uint16)
    loc = _write(tmp_path / "b.bin", bits.tobytes())
    strided = _loc(loc, "bfloat16", (4, 6), strides=(1, 4))
    ref = _bf16_reference(bits).reshape(6, 4).T
    np.testing.assert_array_equal(load_array(strided), ref)
    np.testing.assert_array_equal(np.concatenate(list(iter_chunks(strided, 5))), ref.reshape(-1))


def _to_nz(nd: np.ndarray, n0: int) -> np.ndarray:
    """Block an ND (…, M, N) array into FRACTAL_NZ (B, N1, Mp, N0), element by element."""
    *lead, m, n = nd.shape
    batch = math.prod(lead)
    n1, mp = -(-n // n0), -(-m // 16) * 16
    out = np.zeros((batch, n1, mp, n0), nd.dtype)
    flat = nd.reshape(batch, m, n)
    for b in range(batch):
        for i in range(m):
            for j in range(n):
                out[b, j // n0, i, j % n0] = flat[b, i, j]
    return out


@pytest.mark.parametrize(
    ("nd_shape", "dtype", "n0", "stored_4d"),
    [
        ((20, 40), "float16", 16, True),  # padded in both M and N
        ((32, 32), "float16", 16, False),  # exact blocks, stored shape left for load to infer
        ((2, 3, 17, 9), "float32", 8, True),  # batch dims
        ((5, 70), "int8", 32, True),
    ],
)
def test_fractal_nz_unblocks_to_nd(
    tmp_path: Path, nd_shape: tuple[int, ...], dtype: str, n0: int, stored_4d: bool
) -> None:
    rng = np.random.default_rng(0)
    nd = (rng.standard_normal(nd_shape) * 50).astype(NUMPY_DTYPES[dtype])
    nz = _to_nz(nd, n0)
    stored = (1, *nz.shape[1:]) if nz.shape[0] == 1 else nz.shape
    loc = _write(tmp_path / "nz.bin", nz.tobytes(), 32)
    nz_loc = _loc(loc, dtype, nd_shape, layout="nz", stored_shape=stored if stored_4d else ())
    np.testing.assert_array_equal(load_array(nz_loc), nd)
    for max_elems in (3, 16, 40, 100, 10_000):
        chunks = list(iter_chunks(nz_loc, max_elems))
        assert all(c.size <= max_elems for c in chunks)
        np.testing.assert_array_equal(np.concatenate(chunks), nd.reshape(-1))


def test_nz_shape_that_does_not_fit_is_a_one_line_error(tmp_path: Path) -> None:
    loc = _write(tmp_path / "nz.bin", np.zeros(16 * 16, np.float16).tobytes())
    bad = _loc(loc, "float16", (40, 16), layout="nz", stored_shape=(1, 1, 16, 16))
    with pytest.raises(LayerwatchError, match="FRACTAL_NZ") as err:
        load_array(bad)
    assert "\n" not in str(err.value)


def test_truncated_and_missing_files_are_one_line_errors(tmp_path: Path) -> None:
    data = np.arange(100, dtype=np.float32)
    path = tmp_path / "t.bin"
    path.write_bytes(data.tobytes()[:-3])
    loc = Locator(str(path), 0, 400, "float32", (100,))
    for call in (lambda: load_array(loc), lambda: list(iter_chunks(loc, 30))):
        with pytest.raises(LayerwatchError, match="truncated") as err:
            call()
        assert "\n" not in str(err.value) and str(path) in str(err.value)
    strided = Locator(str(path), 0, 400, "float32", (10, 10), strides=(1, 10))
    with pytest.raises(LayerwatchError, match="truncated"):
        list(iter_chunks(strided, 7))
    missing = Locator(str(tmp_path / "nope.bin"), 0, 4, "float32", (1,))
    with pytest.raises(LayerwatchError, match="not found"):
        load_array(missing)
    with pytest.raises(LayerwatchError, match="unsupported dtype"):
        load_array(Locator(str(path), 0, 4, "int4", (1,)))


def test_iter_chunks_reads_a_large_tensor_piecewise(tmp_path: Path) -> None:
    """Chunks come from separate reads: each chunk owns only its slice of the data."""
    n = 1_000_003
    data = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    loc = _loc(_write(tmp_path / "big.bin", data.tobytes(), 3), "float32", (n,))
    total = 0
    for chunk in iter_chunks(loc, 1 << 16):
        assert chunk.size <= 1 << 16
        assert chunk.base is None or chunk.base.size <= 1 << 16  # not a view of the whole tensor
        np.testing.assert_array_equal(chunk, data[total : total + chunk.size])
        total += chunk.size
    assert total == n


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from([*sorted(NUMPY_DTYPES), "bfloat16", "float8_e4m3fn", "float8_e5m2"]),
    n=st.integers(0, 40),
    step=st.integers(1, 17),
    prefix=st.integers(0, 9),
    as_float=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_reused_chunks_equal_fresh_chunks(
    tmp_path_factory: pytest.TempPathFactory,
    dtype: str,
    n: int,
    step: int,
    prefix: int,
    as_float: bool,
    seed: int,
) -> None:
    """``reuse=True`` refills one buffer per iterator: same values, same dtype, chunk by chunk."""
    size = {"bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}.get(dtype)
    size = size or np.dtype(NUMPY_DTYPES[dtype]).itemsize
    raw = np.random.default_rng(seed).integers(0, 256, size=n * size, dtype=np.uint8)
    if dtype == "bool":
        raw %= 2
    path = tmp_path_factory.mktemp("re") / "t.bin"
    loc = _loc(_write(path, raw.tobytes(), prefix), dtype, (n,))
    fresh = list(iter_chunks(loc, step, as_float=as_float))
    reused = []
    for chunk in iter_chunks(loc, step, as_float=as_float, reuse=True):
        assert 0 < chunk.size <= step
        reused.append(chunk.copy())  # the next chunk overwrites this one
    assert len(reused) == len(fresh)
    for a, b in zip(fresh, reused, strict=True):
        assert a.dtype == b.dtype
        assert a.tobytes() == b.tobytes()  # bit-exact, NaN payloads too
    if not as_float:
        flat = load_flat(loc)
        assert flat.dtype == load_array(loc).dtype
        assert flat.tobytes() == load_array(loc).tobytes()


def test_reused_chunks_and_flat_loads_of_a_truncated_file_are_a_one_line_error(
    tmp_path: Path,
) -> None:
    data = np.arange(100, dtype=np.float32)
    path = tmp_path / "t.bin"
    path.write_bytes(data.tobytes()[:-3])
    loc = Locator(str(path), 0, 400, "float32", (100,))
    for call in (lambda: list(iter_chunks(loc, 30, reuse=True)), lambda: load_flat(loc)):
        with pytest.raises(LayerwatchError, match="truncated") as err:
            call()
        assert "\n" not in str(err.value) and str(path) in str(err.value)
    missing = Locator(str(tmp_path / "nope.bin"), 0, 4, "float32", (1,))
    with pytest.raises(LayerwatchError, match="not found"):
        list(iter_chunks(missing, 30, reuse=True))


def test_canonical_dtype_names() -> None:
    assert canonical_dtype("torch.float32") == "float32"
    assert canonical_dtype("BF16") == "bfloat16"
    assert canonical_dtype("torch.bool") == "bool"
    assert canonical_dtype("half") == "float16"
