"""Watcher behaviours on real directories: initial scan, waiting, new dirs, temp files, the
append-only index, duplicates, a directory removed while watched, and the auto rule."""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from layerwatch.capture.arrivals import Arrival, ArrivalKind
from layerwatch.capture.watch import Watcher, open_watcher
from layerwatch.capture.watch.auto import fs_type, should_poll

MODES = [pytest.param(False, id="inotify"), pytest.param(True, id="polling")]


def _atb(path: Path, n: int = 64) -> None:
    head = f"$Version=1.0\n$Object.Count=1\n$Object.Length={n}\ndtype=2\ndims={n}\n$End=1\n"
    tmp = path.with_name(".tmp-" + path.name)
    tmp.write_bytes(head.encode() + bytes(n))
    os.replace(tmp, path)


class Collector:
    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[Arrival] = queue.SimpleQueue()
        self.got: list[Arrival] = []

    def until(self, done: Callable[[list[Arrival]], bool], timeout: float = 10.0) -> list[Arrival]:
        deadline = time.monotonic() + timeout
        while not done(self.got):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"timed out; got {[(a.kind.value, a.path.name) for a in self.got]}"
                )
            with contextlib.suppress(queue.Empty):
                self.got.append(self.queue.get(timeout=min(left, 0.1)))
        return self.got

    def settle(self, seconds: float = 1.0) -> list[Arrival]:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            try:
                self.got.append(self.queue.get(timeout=left))
            except queue.Empty:
                break
        return self.got

    def files(self, kind: ArrivalKind = ArrivalKind.FILE) -> list[str]:
        return [a.path.name for a in self.got if a.kind is kind]


@pytest.fixture
def watch(tmp_path: Path) -> Iterator[Callable[..., tuple[Watcher, Collector]]]:
    started: list[Watcher] = []

    def make(root: Path, poll: bool) -> tuple[Watcher, Collector]:
        sink = Collector()
        watcher = open_watcher(root, "target", sink.queue, poll=poll, interval=0.1)
        watcher.start()
        started.append(watcher)
        return watcher, sink

    yield make
    for watcher in started:
        watcher.stop()


@pytest.mark.parametrize("poll", MODES)
def test_initial_scan_then_events(tmp_path: Path, watch, poll: bool) -> None:
    rank = tmp_path / "cpu_11"
    rank.mkdir()
    _atb(rank / "before.bin")
    (rank / ".tmp-half.bin").write_bytes(b"$Version")
    _, sink = watch(tmp_path, poll)
    sink.until(lambda got: "before.bin" in [a.path.name for a in got])
    _atb(rank / "after.bin")
    sink.until(lambda got: "after.bin" in [a.path.name for a in got])
    sink.settle(0.5)
    assert sorted(sink.files()) == ["after.bin", "before.bin"]
    assert all(a.side == "target" for a in sink.got)


@pytest.mark.parametrize("poll", MODES)
def test_waits_for_missing_dir_and_follows_new_dirs(tmp_path: Path, watch, poll: bool) -> None:
    root = tmp_path / "a" / "b" / "dump"
    _, sink = watch(root, poll)
    time.sleep(0.3)
    token = root / "cpu_5" / "0"
    token.mkdir(parents=True)
    _atb(token / "x.bin")
    later = root / "cpu_6" / "3" / "node"
    later.mkdir(parents=True)
    _atb(later / "y.bin")
    want_dirs = {root, root / "cpu_5", token, root / "cpu_6", later}
    sink.until(
        lambda got: (
            {"x.bin", "y.bin"} <= {a.path.name for a in got}
            and want_dirs <= {a.path for a in got if a.kind is ArrivalKind.DIR}
        )
    )
    sink.settle(0.5)
    assert sorted(sink.files()) == ["x.bin", "y.bin"]
    dirs = [a.path for a in sink.got if a.kind is ArrivalKind.DIR]
    assert len(dirs) == len(set(dirs))  # each directory reported once


@pytest.mark.parametrize("poll", MODES)
def test_index_growth_and_duplicates(tmp_path: Path, watch, poll: bool) -> None:
    watcher, sink = watch(tmp_path, poll)
    index = tmp_path / "index.jsonl"
    with open(index, "a") as fh:
        fh.write('{"k":"token","token":0}\n')
        fh.flush()
        sink.until(lambda got: ArrivalKind.GREW in [a.kind for a in got])
        fh.write('{"k":"end"}\n')
        fh.flush()
        sink.until(lambda got: [a.kind for a in got].count(ArrivalKind.GREW) >= 2)
    data = tmp_path / "t.bin"
    _atb(data)
    sink.until(lambda got: "t.bin" in [a.path.name for a in got])
    with open(data, "ab"):  # an open for writing that changes nothing: close-write event
        pass
    watcher.request_rescan()  # and a rescan that sees the file again
    watcher.final_scan()
    sink.settle(1.0)
    assert sink.files().count("t.bin") == 1


@pytest.mark.parametrize("poll", MODES)
def test_unframed_file_arrives_when_closed_or_stable(tmp_path: Path, watch, poll: bool) -> None:
    _, sink = watch(tmp_path, poll)
    with open(tmp_path / "statistics.csv", "w") as fh:
        fh.write("a,b\n")
        fh.flush()
        time.sleep(0.5)
        sink.settle(0.1)
        assert "statistics.csv" not in sink.files()
        fh.write("1,2\n")
    sink.until(lambda got: "statistics.csv" in [a.path.name for a in got], timeout=5)


@pytest.mark.parametrize("poll", MODES)
def test_directory_removed_while_watching(tmp_path: Path, watch, poll: bool) -> None:
    root = tmp_path / "dump"
    (root / "cpu_1").mkdir(parents=True)
    _atb(root / "cpu_1" / "a.bin")
    watcher, sink = watch(root, poll)
    sink.until(lambda got: "a.bin" in [a.path.name for a in got])
    shutil.rmtree(root)
    gone = sink.until(lambda got: ArrivalKind.GONE in [a.kind for a in got])
    assert "removed" in next(a for a in gone if a.kind is ArrivalKind.GONE).message
    # It comes back (the user re-ran the job): the watcher picks it up again.
    (root / "cpu_2").mkdir(parents=True)
    _atb(root / "cpu_2" / "b.bin")
    sink.until(lambda got: "b.bin" in [a.path.name for a in got])
    assert watcher.attached
    assert ArrivalKind.ERROR not in [a.kind for a in sink.got]


def test_final_scan_reports_truncated_files(tmp_path: Path, watch) -> None:
    watcher, sink = watch(tmp_path, False)
    (tmp_path / "cut.bin").write_bytes(b"$Version=1.0\n$Object.Length=100\n$End=1\n" + bytes(10))
    (tmp_path / "late.csv").write_text("x\n")
    time.sleep(0.3)
    left = watcher.final_scan()
    assert list(left) == [tmp_path / "cut.bin"]
    assert "of" in left[tmp_path / "cut.bin"]
    sink.settle(0.3)
    assert "late.csv" in sink.files()


def test_auto_rule_reads_mount_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/vda / ext4 rw 0 0\nserver:/x {tmp_path} nfs4 rw 0 0\n")
    assert fs_type(tmp_path / "not" / "there", str(mounts)) == "nfs4"
    assert fs_type(Path("/usr"), str(mounts)) == "ext4"
    monkeypatch.setenv("LAYERWATCH_POLL", "1")
    assert should_poll(tmp_path)[0] is True
    monkeypatch.setenv("LAYERWATCH_POLL", "0")
    assert should_poll(tmp_path)[0] is False
    monkeypatch.delenv("LAYERWATCH_POLL")
    assert should_poll(tmp_path, True) == (True, "polling (--poll)")
    assert open_watcher(tmp_path, "golden", queue.SimpleQueue(), poll=True).kind == "polling"


@pytest.mark.parametrize("poll", MODES)
def test_json_rewritten_in_place_arrives_again(tmp_path: Path, watch, poll: bool) -> None:
    """msprobe rewrites dump.json in place (same inode) as it grows: each complete version
    arrives; the half-written moment in between does not."""
    _, sink = watch(tmp_path, poll)
    path = tmp_path / "dump.json"
    path.write_text('{"data": {"a": 1}}')
    sink.until(lambda got: [a.path.name for a in got].count("dump.json") == 1)
    with open(path, "w") as fh:  # truncate, write half, pause, finish: same inode
        fh.write('{"data": {"a": 1, "b": ')
        fh.flush()
        time.sleep(0.6)
        fh.write("2}}")
    sink.until(lambda got: [a.path.name for a in got].count("dump.json") == 2)
    sink.settle(0.5)
    assert sink.files().count("dump.json") == 2


@pytest.mark.parametrize("poll", MODES)
def test_dead_observer_thread_is_replaced(tmp_path: Path, watch, poll: bool) -> None:
    """If watchdog's emitter thread ends (a bug, a lost inotify fd), the watcher notices, says
    so, watches again and rescans: nothing that lands meanwhile is lost or doubled."""
    watcher, sink = watch(tmp_path, poll)
    _atb(tmp_path / "a.bin")
    sink.until(lambda got: "a.bin" in [a.path.name for a in got])
    for emitter in list(watcher._observer.emitters):
        emitter.stop()
        emitter.join(5)
    _atb(tmp_path / "b.bin")
    got = sink.until(lambda got: "b.bin" in [a.path.name for a in got])
    assert any(a.kind is ArrivalKind.ERROR and "watching it again" in a.message for a in got)
    sink.settle(0.5)
    assert sorted(sink.files()) == ["a.bin", "b.bin"]
