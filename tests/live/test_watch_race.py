"""A real writer process racing the watcher: every complete file arrives exactly once, never
partial; files left half-written are reported as incomplete, not handed over."""

from __future__ import annotations

import collections
import importlib.util
import queue
import subprocess
import sys
import time
from pathlib import Path

import pytest
from layerwatch.capture.arrivals import ArrivalKind
from layerwatch.capture.watch import open_watcher

WRITER = Path(__file__).with_name("race_writer.py")
_spec = importlib.util.spec_from_file_location("race_writer", WRITER)
assert _spec and _spec.loader
race_writer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(race_writer)

STUCK = 3


def _race(tmp_path: Path, *, poll: bool, count: int) -> None:
    root = tmp_path / "not-yet" / "dump"  # created by the writer: the watcher waits for it
    arrivals: queue.SimpleQueue = queue.SimpleQueue()
    watcher = open_watcher(root, "golden", arrivals, poll=poll, interval=0.1)
    watcher.start()
    seen: collections.Counter[Path] = collections.Counter()
    partial: list[str] = []
    try:
        writer = subprocess.Popen(
            [sys.executable, str(WRITER), str(root), str(count), "7", "--stuck", str(STUCK)],
            stdout=subprocess.PIPE,
            text=True,
        )
        want = count - STUCK
        started = time.monotonic()
        deadline = started + 150
        all_in = None  # when the last complete file arrived through the events
        while time.monotonic() < deadline:
            if all_in is None and len(seen) >= want:
                all_in = time.monotonic() - started
            if writer.poll() is not None and len(seen) >= want and watcher.idle_for() > 1.5:
                break
            try:
                arrival = arrivals.get(timeout=0.2)
            except queue.Empty:
                continue
            assert arrival.kind is not ArrivalKind.ERROR, arrival.message
            if arrival.kind is ArrivalKind.FILE:
                seen[arrival.path] += 1
                # Checked the moment it arrives: a file handed over early would be short here.
                if arrival.path.read_bytes() != race_writer.expected(arrival.path):
                    partial.append(arrival.path.name)
        if all_in is None:  # say what is missing before failing
            complete = {
                p for p in root.rglob("f*.bin") if p.read_bytes() == race_writer.expected(p)
            }
            missing = sorted(str(p.relative_to(root)) for p in complete - set(seen))
            raise AssertionError(
                f"{len(missing)} never arrived: {missing[:5]}; pending {list(watcher.pending().items())[:3]}"
            )
        assert all_in < 60, all_in  # live, not left to the final scan
        assert writer.wait(timeout=5) == 0
        assert writer.stdout is not None and "DONE" in writer.stdout.read()
        incomplete = watcher.final_scan()
    finally:
        watcher.stop()
    while True:  # anything the final scan still emitted
        try:
            arrival = arrivals.get_nowait()
        except queue.Empty:
            break
        if arrival.kind is ArrivalKind.FILE:
            seen[arrival.path] += 1

    files = sorted(root.rglob("f*.bin"))
    assert len(files) == count
    complete = {p for p in files if p.read_bytes() == race_writer.expected(p)}
    assert len(complete) == count - STUCK
    assert partial == []
    assert {p for p, n in seen.items() if n > 1} == set()
    assert set(seen) == complete
    assert set(incomplete) == set(files) - complete
    assert all("bytes" in reason for reason in incomplete.values())


@pytest.mark.slow
def test_inotify_writer_race_10000_files(tmp_path: Path) -> None:
    _race(tmp_path, poll=False, count=10_000)


@pytest.mark.slow
def test_polling_writer_race(tmp_path: Path) -> None:
    _race(tmp_path, poll=True, count=2_000)
