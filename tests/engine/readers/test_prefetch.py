"""readers/prefetch.py: payloads read ahead in a thread come out as the caller would read them,
fail the same pair with the same line, and never hold more than the ring."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.numerics.metrics import paired_chunks
from layerwatch.engine.readers.load import iter_chunks
from layerwatch.engine.readers.prefetch import PayloadPrefetch, prefetchable
from layerwatch.engine.records import Locator

CHUNK = 64


def _payload(path: Path, raw: np.ndarray, dtype: str, prefix: int = 0) -> Locator:
    path.write_bytes(b"\x5a" * prefix + raw.tobytes())
    return Locator(str(path), prefix, raw.nbytes, dtype, raw.shape)


def _pair(tmp_path: Path, name: str, n: int, dtypes: tuple[str, str], seed: int) -> tuple:
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(n).astype(np.float32)
    out = []
    for side, dtype in zip(("g", "t"), dtypes, strict=True):
        if dtype == "bfloat16":
            raw = (values.view(np.uint32) >> 16).astype(np.uint16)
        else:
            raw = values.astype(dtype)
        out.append(_payload(tmp_path / f"{name}.{side}", raw, dtype, prefix=seed % 13))
    return tuple(out)


def _stored(loc: Locator) -> np.ndarray:
    sdt = np.uint16 if loc.dtype == "bfloat16" else np.dtype(loc.dtype)
    return np.fromfile(loc.path, dtype=sdt, offset=loc.offset)[: int(np.prod(loc.shape))]


def _direct(golden: Locator, target: Locator) -> list[tuple[np.ndarray, np.ndarray]]:
    """What the caller reads itself (bf16 as bits: the stored elements)."""
    return [
        (g.copy(), t.copy())
        for g, t in paired_chunks(
            iter_chunks(golden, CHUNK, reuse=True, bf16_bits=golden.dtype == "bfloat16"),
            iter_chunks(target, CHUNK, reuse=True, bf16_bits=target.dtype == "bfloat16"),
        )
    ]


@pytest.mark.parametrize("slots,per_slot", [(1, 1), (2, 3), (4, 4)])
def test_chunks_are_the_callers_own_reads(tmp_path, slots, per_slot) -> None:
    """Every pair's chunks (sizes, values, order) equal iter_chunks's, for several dtypes and
    lengths around the chunk and slot sizes, whatever the ring's shape."""
    kinds = [("float32", "bfloat16"), ("float32", "float32"), ("float16", "float64")]
    kinds += [("int64", "int64"), ("uint8", "uint8")]
    sizes = [1, CHUNK - 1, CHUNK, CHUNK * per_slot, CHUNK * per_slot + 1, 7 * CHUNK + 5]
    pairs = [_pair(tmp_path, f"p{i}", n, kinds[i % len(kinds)], i) for i, n in enumerate(sizes * 2)]
    with PayloadPrefetch(pairs, CHUNK, slots=slots, per_slot=per_slot) as ahead:
        for golden, target in pairs:
            chunks = ahead.take(golden, target)
            assert chunks is not None
            got = [(g.copy(), t.copy()) for g, t in chunks]
            want = _direct(golden, target)
            assert [g.size for g, _ in got] == [g.size for g, _ in want]
            for (gg, gt), (wg, wt) in zip(got, want, strict=True):
                assert gg.dtype == wg.dtype and gt.dtype == wt.dtype
                assert np.array_equal(gg, wg) and np.array_equal(gt, wt)


def test_skipped_and_abandoned_pairs(tmp_path) -> None:
    """A pair the caller skips or leaves part-way does not leak into the next one; a pair
    already passed is not handed out again (the caller reads it itself)."""
    pairs = [_pair(tmp_path, f"p{i}", 5 * CHUNK + i, ("float32", "bfloat16"), i) for i in range(5)]
    with PayloadPrefetch(pairs, CHUNK, slots=2, per_slot=1) as ahead:
        first = ahead.take(*pairs[0])
        assert first is not None
        next(first)  # one chunk of five, then on to pair 2
        third = ahead.take(*pairs[2])
        assert third is not None
        got = np.concatenate([g.copy() for g, _ in third])
        assert np.array_equal(got, _stored(pairs[2][0]))
        assert ahead.take(*pairs[1]) is None
        assert ahead.take(pairs[4][0], pairs[3][1]) is None  # not a pair it reads
        last = ahead.take(*pairs[4])
        assert last is not None
        assert np.array_equal(np.concatenate([t.copy() for _, t in last]), _stored(pairs[4][1]))


@pytest.mark.parametrize(
    "broken", ["golden missing", "target missing", "golden short", "target short"]
)
def test_a_bad_file_fails_its_pair_with_the_callers_line(tmp_path, broken) -> None:
    """A missing or truncated payload raises for its own pair the line the caller's own reads
    raise (same side first); the pairs around it are read as usual."""
    pairs = [_pair(tmp_path, f"p{i}", 4 * CHUNK, ("float32", "bfloat16"), i) for i in range(3)]
    side = 0 if broken.startswith("golden") else 1
    path = Path(pairs[1][side].path)
    if broken.endswith("missing"):
        path.unlink()
    else:
        path.write_bytes(path.read_bytes()[: -3 * CHUNK])
    with pytest.raises(LayerwatchError) as direct:
        _direct(*pairs[1])
    with PayloadPrefetch(pairs, CHUNK, slots=2, per_slot=2) as ahead:
        assert len(list(ahead.take(*pairs[0]) or ())) == 4
        with pytest.raises(LayerwatchError) as ahead_error:
            list(ahead.take(*pairs[1]) or ())
        assert str(ahead_error.value) == str(direct.value)
        last = ahead.take(*pairs[2])
        assert last is not None and len(list(last)) == 4


def test_memory_stays_within_the_ring(tmp_path) -> None:
    """48 MB of pairs through a 2-slot ring of 1 MB slots: the reader never runs more than the
    ring ahead of a caller that holds back, and reading everything never holds more than the
    ring (a reader that kept every payload would hold all 48 MB)."""
    chunk = 1 << 16
    pairs = [_pair(tmp_path, f"p{i}", 1 << 18, ("float32", "float32"), i) for i in range(24)]
    total = sum(g.nbytes + t.nbytes for g, t in pairs)
    assert total == 48 << 20
    tracemalloc.start()
    try:
        with PayloadPrefetch(pairs, chunk, slots=2, per_slot=2) as ahead:
            ring = ahead.slots * ahead.slot_bytes
            assert ring == 2 << 20
            time.sleep(0.3)  # the caller holds back: the reader fills the ring and waits
            assert 0 < ahead.bytes_read <= ring
            sums = []
            for golden, target in pairs:
                chunks = ahead.take(golden, target)
                assert chunks is not None
                sums.append(sum(float(g.sum()) - float(t.sum()) for g, t in chunks))
            assert ahead.bytes_read == total
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sums == [0.0] * len(pairs)
    assert peak < ring + (4 << 20), peak


def test_close_stops_a_reader_waiting_for_a_slot(tmp_path) -> None:
    pairs = [_pair(tmp_path, f"p{i}", 8 * CHUNK, ("float32", "float32"), i) for i in range(4)]
    ahead = PayloadPrefetch(pairs, CHUNK, slots=1, per_slot=1)
    chunks = ahead.take(*pairs[0])
    assert chunks is not None
    next(chunks)
    ahead.close()
    assert not ahead._thread.is_alive()


def test_what_is_read_ahead(tmp_path) -> None:
    """Contiguous, non-empty, equal-length pairs only; strided, blocked, empty, unknown dtypes
    and unequal lengths are left to the caller."""
    g, t = _pair(tmp_path, "p", 12, ("float32", "float32"), 1)
    assert prefetchable(g, t)
    strided = Locator(g.path, g.offset, g.nbytes, "float32", (3, 2), strides=(4, 1))
    assert not prefetchable(strided, t)
    assert not prefetchable(
        Locator(g.path, 0, 0, "float32", (0,)), Locator(t.path, 0, 0, "float32", (0,))
    )
    assert not prefetchable(Locator(g.path, 0, 48, "float32", (12,), layout="nz"), t)
    assert not prefetchable(Locator(g.path, 0, 48, "quaternion", (12,)), t)
    assert not prefetchable(g, Locator(t.path, t.offset, 44, "float32", (11,)))
