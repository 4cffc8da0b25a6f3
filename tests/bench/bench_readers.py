"""Readers benchmark: opening dumps and producing records vs just loading the bytes.

    OMP_NUM_THREADS=1 python tests/bench/bench_readers.py [--small 3000] [--big 8] [--repeat 5]

Prints medians of ``--repeat`` runs, each figure beside a baseline measured in the same run:
* records/s for a full scan (``open_dump(...).poll()``) of msit / ATB / layerwatch / msprobe
  dumps of many small tensors, and the per-file cost of the .pth and .bin header steps;
* the per-arrival cost of ``poll([path])`` (live reading);
* load throughput (GB/s) of ``load_array`` on MB-sized tensors vs a plain ``np.fromfile`` of the
  same payload (the floor) and vs ``torch.load`` (what msit does per file).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _median(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _each(fn, items) -> None:  # type: ignore[no-untyped-def]
    """Call ``fn`` on every item, dropping each result at once (like a streaming consumer)."""
    for item in items:
        fn(item)


def make_msit(root: Path, n: int) -> list[Path]:
    import torch

    rank = root / "msit_dump_b" / "torch_tensors" / "cpu_1"
    files = []
    per_token = 100
    for i in range(n):
        node = rank / str(i // per_token) / f"root.model.layers.{(i % per_token) // 4}.m{i % 4}"
        node.mkdir(parents=True, exist_ok=True)
        path = node / "output.pth"
        torch.save(torch.randn(1, 16, 64), path)
        files.append(path)
    (rank / "model_tree.json").write_text(json.dumps({"name": "root", "type": "M", "children": []}))
    return files


def make_atb(root: Path, n: int) -> list[Path]:
    from support import atb

    rank = root / "atb" / "tensors" / "0_1"
    files = []
    x = np.random.default_rng(0).standard_normal((1, 16, 64)).astype(np.float16)
    for i in range(n):
        path = (
            rank
            / str(i // 100)
            / f"{(i % 100) // 4}_Layer"
            / f"{i % 4}_Op"
            / "after"
            / "outtensor0.bin"
        )
        atb.write_bin(path, x)
        files.append(path)
    return files


def make_layerwatch(root: Path, n: int) -> Path:
    from layerwatch.capture import format as lwf

    rank = root / "lw" / "cpu_1"
    (rank / "data").mkdir(parents=True)
    payload = np.random.default_rng(0).standard_normal(1024).astype(np.float32).tobytes()
    data = rank / lwf.data_file_name(0)
    data.write_bytes(struct.pack("<Q", 2) + b"{}" + payload * 64)
    lines = []
    for i in range(n):
        begin = 10 + (i % 64) * len(payload)
        entry = lwf.IndexTensor(i // 100, f"root.m{i % 100}", "output", "float32", (1024,), lwf.data_file_name(0),
                                begin, begin + len(payload), i % 100, "Linear",
                                {"max": 1.0, "min": -1.0, "mean": 0.0, "norm": 3.0, "nan": 0, "inf": 0})  # fmt: skip
        lines.append(lwf.encode_line(entry.to_json()))
    (rank / lwf.INDEX).write_text("".join(lines))
    return rank.parent


def bench_small(tmp: Path, n: int, repeat: int) -> None:
    import torch
    from layerwatch.engine.readers import open_dump
    from layerwatch.engine.readers.atb_bin import read_header
    from layerwatch.engine.readers.load import load_array
    from layerwatch.engine.readers.pth import pth_locator

    print(f"\n== many small tensors ({n} files of 1x16x64) ==")
    msit_files = make_msit(tmp, n)
    atb_files = make_atb(tmp, n)
    lw = make_layerwatch(tmp, n)
    floor = _median(lambda: _each(lambda f: np.fromfile(f, np.uint8, count=64), msit_files), repeat)
    rows = [("floor: open+read 64 B of each file (np.fromfile)", floor, n)]
    rows.append(
        (
            "msit full scan: open_dump + poll()",
            _median(lambda: open_dump(tmp / "msit_dump_b").poll(), repeat),
            n,
        )
    )
    rows.append(
        (
            "  .pth zip directory + restricted unpickle (pth_locator)",
            _median(lambda: _each(pth_locator, msit_files), repeat),
            n,
        )
    )
    sub = msit_files[: max(1, n // 10)]
    rows.append(
        (
            "  torch.load(weights_only=True) per file (msit's way)",
            _median(lambda: _each(lambda f: torch.load(f, weights_only=True), sub), repeat)
            * n
            / len(sub),
            n,
        )
    )
    rows.append(
        (
            "ATB full scan: open_dump + poll()",
            _median(lambda: open_dump(tmp / "atb").poll(), repeat),
            n,
        )
    )
    rows.append(
        (
            "  .bin header parse (read_header)",
            _median(lambda: _each(read_header, atb_files), repeat),
            n,
        )
    )
    rows.append(
        (
            "layerwatch full scan: open_dump + poll()",
            _median(lambda: open_dump(lw).poll(), repeat),
            n,
        )
    )
    recs = open_dump(tmp / "msit_dump_b").poll().tensors
    rows.append(
        (
            "load every msit tensor (load_array)",
            _median(lambda: _each(lambda r: load_array(r.loc), recs), repeat),
            n,
        )
    )
    for label, secs, count in rows:
        print(
            f"{label:58s} {secs * 1e3:9.1f} ms  {count / secs:10.0f} files/s  {secs / count * 1e6:7.1f} us/file  x{secs / floor:5.2f} floor"
        )

    def live() -> float:
        """Files appear one by one (hard links) while 3000 others are already there."""
        shutil.rmtree(tmp / "live", ignore_errors=True)
        dst = tmp / "live" / "torch_tensors" / "cpu_1"
        dst.mkdir(parents=True)
        reader = open_dump(tmp / "live")
        spent = 0.0
        for f in msit_files:
            target = dst / f.relative_to(msit_files[0].parents[2])
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(f, target)
            t0 = time.perf_counter()
            reader.poll([target])
            spent += time.perf_counter() - t0
        return spent / len(msit_files)

    per_call = statistics.median(live() for _ in range(repeat))
    print(
        f"{'live: poll([path]) per arriving .pth':58s} {per_call * 1e6:9.1f} us per call (pth step alone {rows[2][1] / n * 1e6:.1f} us)"
    )


def bench_big(tmp: Path, count: int, repeat: int) -> None:
    import torch
    from layerwatch.engine.readers.load import iter_chunks, load_array
    from layerwatch.engine.readers.pth import pth_locator
    from support import atb

    print(f"\n== MB-sized tensors ({count} x 4 MiB fp32, and bf16 .bin) ==")
    pths, bins = [], []
    for i in range(count):
        t = torch.randn(1024, 1024)
        p = tmp / f"big{i}.pth"
        torch.save(t, p)
        pths.append(p)
        b = tmp / f"big{i}.bin"
        atb.write_bin(b, t.numpy(), dtype="bfloat16")
        bins.append(b)
    locs = [pth_locator(p) for p in pths]
    nbytes = sum(loc.nbytes for loc in locs)
    floor = _median(
        lambda: _each(
            lambda loc: np.fromfile(loc.path, np.float32, count=loc.nbytes // 4, offset=loc.offset),
            locs,
        ),
        repeat,
    )
    ours = _median(lambda: _each(lambda p: load_array(pth_locator(p)), pths), repeat)
    chunks = _median(
        lambda: _each(lambda loc: sum(c.size for c in iter_chunks(loc, 1 << 18)), locs), repeat
    )
    tload = _median(lambda: _each(lambda p: torch.load(p, weights_only=True).numpy(), pths), repeat)
    from layerwatch.engine.readers.atb_bin import read_header

    def atb_load() -> None:
        for b in bins:
            h = read_header(b)
            off, length = h.data  # type: ignore[misc]
            from layerwatch.engine.records import Locator

            load_array(Locator(str(b), off, length, "bfloat16", h.dims))

    bf_floor = _median(
        lambda: _each(
            lambda b: np.fromfile(
                b, np.uint16, count=1 << 20, offset=os.path.getsize(b) - (2 << 20)
            ),
            bins,
        ),
        repeat,
    )
    bf_ours = _median(atb_load, repeat)
    gb = nbytes / 1e9
    print(f"{'floor: np.fromfile of the payload (fp32 .pth)':58s} {gb / floor:7.2f} GB/s")
    print(
        f"{'pth_locator + load_array (.pth)':58s} {gb / ours:7.2f} GB/s  {floor / ours * 100:5.1f} % of floor"
    )
    print(
        f"{'iter_chunks(256K elems) (.pth)':58s} {gb / chunks:7.2f} GB/s  {floor / chunks * 100:5.1f} % of floor"
    )
    print(
        f"{'torch.load(weights_only=True) (msit)':58s} {gb / tload:7.2f} GB/s  {floor / tload * 100:5.1f} % of floor"
    )
    gb_bf = count * (2 << 20) / 1e9
    print(
        f"{'floor: np.fromfile of a bf16 .bin payload':58s} {gb_bf / bf_floor:7.2f} GB/s (bf16 bytes)"
    )
    print(
        f"{'read_header + load_array, bf16 -> fp32 (.bin)':58s} {gb_bf / bf_ours:7.2f} GB/s  {bf_floor / bf_ours * 100:5.1f} % of floor"
    )


def bench_fixtures(repeat: int) -> None:
    from layerwatch.engine.readers import open_dump

    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    print("\n== committed fixtures (full scan) ==")
    for rel in (
        "msit/golden/msit_dump_fixture",
        "msprobe/tensor_golden",
        "msprobe/stats_golden",
        "atb/msit_dump_fixture",
    ):
        n = len(open_dump(fixtures / rel).poll().tensors)
        secs = _median(lambda rel=rel: open_dump(fixtures / rel).poll(), repeat)
        print(f"{rel:58s} {n:6d} records {secs * 1e3:8.1f} ms  {n / secs:9.0f} records/s")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--small", type=int, default=3000)
    parser.add_argument("--big", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-readers-"))
    try:
        bench_small(tmp, args.small, args.repeat)
        bench_big(tmp, args.big, args.repeat)
        bench_fixtures(args.repeat)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
