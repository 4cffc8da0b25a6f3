"""compare_pairs with the large pairs' payloads read ahead in a thread (readers/prefetch.py)
gives the very rows of the caller reading them itself: metrics bit for bit, verdicts, reasons,
side statistics — on the compiled kernel and on the numpy path, with bad files among them."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from layerwatch.capture import cpus
from layerwatch.engine.numerics import compare as compare_mod
from layerwatch.engine.numerics import fused
from layerwatch.engine.numerics.compare import compare_pairs
from layerwatch.engine.numerics.thresholds import Thresholds
from layerwatch.engine.records import Locator, Stats, TensorKey, TensorRecord

N = 40_000  # above segments.SMALL: streamed one pair at a time
CHUNK = 4_096


def _record(path: Path, raw: np.ndarray, dtype: str, stem: str, **kw: object) -> TensorRecord:
    raw.tofile(path)
    loc = Locator(str(path), 0, raw.nbytes, dtype, raw.shape, **kw)  # type: ignore[arg-type]
    return TensorRecord(TensorKey(0, "root.mlp", stem), dtype, tuple(raw.shape), loc)


def _bf16(values: np.ndarray) -> np.ndarray:
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _items(tmp_path: Path) -> list[tuple[TensorRecord, TensorRecord, bool]]:
    rng = np.random.default_rng(5)
    items: list[tuple[TensorRecord, TensorRecord, bool]] = []

    def add(stem: str, g: np.ndarray, t: np.ndarray, gd: str, td: str, logits=False, **kw):
        golden = _record(tmp_path / f"{stem}.g", g, gd, stem, **kw)
        target = _record(tmp_path / f"{stem}.t", t, td, stem)
        items.append((golden, target, logits))
        return golden, target

    for i in range(6):  # fp32 golden, bf16 target (the dump's common case), NaN/Inf here and there
        g = rng.standard_normal(N + 97 * i).astype(np.float32)
        t = g * np.float32(1 + 1e-3 * i)
        if i % 2:
            g[[5, 9000]] = np.nan
            t[[5, 12]] = np.inf
        add(f"bf16.{i}", g, _bf16(t), "float32", "bfloat16")
    g = rng.standard_normal(N).astype(np.float16)
    add("fp16", g, (g * np.float16(1.01)).astype(np.float16), "float16", "float16")
    ints = rng.integers(-50, 50, N).astype(np.int32)
    add("int", ints, ints + (rng.random(N) < 0.01), "int32", "int32")
    logits = rng.standard_normal((4, 12_000)).astype(np.float32)
    add("logits", logits, _bf16(logits + 0.01), "float32", "bfloat16", logits=True)
    masked = rng.standard_normal(N).astype(np.float32)
    masked[:100] = np.finfo(np.float32).min
    half = np.clip(masked, -60_000, 60_000).astype(np.float16)
    half[:100] = np.finfo(np.float16).min
    golden, target = add("masked", masked, half, "float32", "float16")
    golden.stats = Stats(1.0, float(np.finfo(np.float32).min), 0.0, 1.0)
    target.stats = Stats(1.0, float(np.finfo(np.float16).min), 0.0, 1.0)
    wide = rng.standard_normal((N // 100, 200)).astype(np.float32)  # read as a strided view
    wide.tofile(tmp_path / "strided.g")
    view = Locator(
        str(tmp_path / "strided.g"), 0, wide.nbytes, "float32", (N // 100, 100), (200, 2)
    )
    golden = TensorRecord(TensorKey(0, "root.mlp", "strided"), "float32", view.shape, view)
    target = _record(tmp_path / "strided.t", _bf16(wide[:, ::2]), "bfloat16", "strided")
    items.append((golden, target, False))
    g = rng.standard_normal(N).astype(np.float32)
    _, gone = add("missing", g, _bf16(g), "float32", "bfloat16")
    Path(gone.loc.path).unlink()  # type: ignore[union-attr]
    short, _ = add("short", g, _bf16(g), "float32", "bfloat16")
    Path(short.loc.path).write_bytes(Path(short.loc.path).read_bytes()[: N * 2])  # type: ignore[union-attr]
    for i in range(3):  # small pairs (segment batches) in between
        s = rng.standard_normal(300).astype(np.float32)
        add(f"small.{i}", s, _bf16(s), "float32", "bfloat16")
    g = rng.standard_normal(N).astype(np.float32)
    add("after", g, g + np.float32(1e-4), "float32", "float32")
    return items


def _rows(results) -> list[tuple]:
    def same_nan(metrics: dict[str, float]) -> tuple:
        return tuple((k, "nan" if math.isnan(v) else v) for k, v in sorted(metrics.items()))

    return [
        (r.key, r.verdict, same_nan(r.metrics), r.failed, r.reason, r.golden_stats, r.target_stats)
        for r in results
    ]


@pytest.fixture(params=["kernel", "numpy"])
def engine(request, monkeypatch) -> str:
    if request.param == "numpy":
        monkeypatch.setenv("LAYERWATCH_NO_NUMBA", "1")
        return "numpy"
    monkeypatch.delenv("LAYERWATCH_NO_NUMBA", raising=False)
    monkeypatch.setitem(fused._STATE, "kernel", None)
    monkeypatch.setitem(fused._STATE, "failed", False)
    if fused.load() is None:
        pytest.skip("llvmlite is not installed")
    return "kernel"


def test_prefetched_rows_equal_the_callers_own_reads(engine, tmp_path, monkeypatch) -> None:
    items = _items(tmp_path)
    th = Thresholds.default()
    monkeypatch.setattr(compare_mod, "PREFETCH_FROM", 0)
    monkeypatch.setenv("LAYERWATCH_PREFETCH", "1")
    used = []
    make = compare_mod._prefetch

    def spy(*args, **kw):
        ahead = make(*args, **kw)
        used.append(ahead)
        return ahead

    monkeypatch.setattr(compare_mod, "_prefetch", spy)
    got = compare_pairs(items, th, chunk_elems=CHUNK, side_stats=True)
    assert used and used[0] is not None and used[0].bytes_read > 0  # the thread did read
    monkeypatch.setenv("LAYERWATCH_PREFETCH", "0")
    want = compare_pairs(items, th, chunk_elems=CHUNK, side_stats=True)
    assert used[-1] is None
    assert _rows(got) == _rows(want)
    reasons = {r.key.stem: r.reason for r in got}
    assert "file not found" in reasons["missing"] and "truncated" in reasons["short"]
    assert reasons["after"] == "" and reasons["strided"] == ""


def test_when_a_thread_reads_ahead(tmp_path, monkeypatch) -> None:
    """Only for PREFETCH_FROM bytes of streamed pairs or more, with a core to spare: two or
    more cores and a load average below cores − ½ (LAYERWATCH_PREFETCH=1/0 decides instead)."""
    items = _items(tmp_path)
    monkeypatch.delenv("LAYERWATCH_PREFETCH", raising=False)
    monkeypatch.setattr(cpus, "cores", lambda: 2)
    monkeypatch.setattr(compare_mod.os, "getloadavg", lambda: (0.9, 0.9, 0.9))
    assert compare_mod._prefetch(items, CHUNK) is None  # ~1.5 MB, below PREFETCH_FROM
    monkeypatch.setattr(compare_mod, "PREFETCH_FROM", 0)
    ahead = compare_mod._prefetch(items, CHUNK)
    assert ahead is not None
    ahead.close()
    monkeypatch.setattr(compare_mod.os, "getloadavg", lambda: (1.6, 0.9, 0.9))  # box busy
    assert compare_mod._prefetch(items, CHUNK) is None
    monkeypatch.setenv("LAYERWATCH_PREFETCH", "1")
    ahead = compare_mod._prefetch(items, CHUNK)
    assert ahead is not None
    ahead.close()
    monkeypatch.setattr(cpus, "cores", lambda: 1)
    monkeypatch.delenv("LAYERWATCH_PREFETCH")
    monkeypatch.setattr(compare_mod.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert compare_mod._prefetch(items, CHUNK) is None  # one core: nothing to overlap on
