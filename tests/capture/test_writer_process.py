"""The writer process (``capture/writer_process.py``) writes the same dump as the thread writer,
keeps the queue's bound, and ends in one line when it dies, when the disk is full or when the
model process is killed. Real processes, real tiny models."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from layerwatch.capture import DumpConfig, register_hook, writer_process
from layerwatch.capture.writer_process import ENV, ProcessWriter
from support import lwdump, tiny_hf, writers
from support.wide import Wide
from torch import nn

pytest.importorskip("transformers")

_VARIES = {"started", "updated", "pid", "argv"}


def _hf_run(
    out: Path,
    mode: str,
    monkeypatch: pytest.MonkeyPatch,
    spawn_after: int = 1,
    grad_mode: Any = torch.no_grad,
    **config: object,
) -> Path:
    writers.select(monkeypatch, "handover" if mode == "ahead" else mode, spawn_after)
    model = tiny_hf.build("llama", torch.float16)
    ids = tiny_hf.prompt()
    # the batches are cut by flushes (each layer's MLP, each token's end) and by batch_bytes,
    # never by the clock, so every writer sees the same batches and writes the same files; a
    # cut inside a layer leaves aliases waiting for their source (the layer's input) and
    # aliases of a source written before the cut: both cross a hand-over there
    config = {"flush_interval": 600.0, **config}
    ahead = None
    if mode == "ahead":  # started as layerwatch dump's processes start it (capture/autohook.py)
        monkeypatch.setattr(writer_process, "second_core", lambda: True)
        writer_process.prestart(DumpConfig(dump_path=out))
        (ahead,) = writer_process._WARM
    handle = register_hook(model, DumpConfig(dump_path=out, **config))  # type: ignore[arg-type]
    assert not writer_process._WARM
    assert isinstance(handle._writer, ProcessWriter) == (mode != "thread")

    def flush(*_: object) -> None:
        handle._recorder.hand_over(urgent=False)  # type: ignore[union-attr]
        handle.flush()

    model.register_forward_hook(flush)
    for layer in model.model.layers:
        layer.mlp.register_forward_hook(flush)
    with grad_mode():
        model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, min_new_tokens=12,
            do_sample=False, pad_token_id=0,
        )  # fmt: skip
    handle.close()
    assert handle.failed is None
    if mode != "thread":
        writer = handle._writer
        assert isinstance(writer, ProcessWriter) and writer.remote and not writer.local
        assert writer._proc is not None and writer._proc.returncode == 0
        here = writer.items_here
        assert here == 0 if mode in ("process", "ahead") else 0 < spawn_after <= here < 800
        assert ahead is None or writer._proc is ahead
    return handle.run_dir  # type: ignore[return-value]


def _same_dump(a: Path, b: Path) -> None:
    assert (a / "index.jsonl").read_bytes() == (b / "index.jsonl").read_bytes()
    files_a = sorted(p.name for p in (a / "data").iterdir())
    assert files_a == sorted(p.name for p in (b / "data").iterdir())
    assert files_a and not any(name.startswith(".tmp-") for name in files_a)
    for name in files_a:
        assert (a / "data" / name).read_bytes() == (b / "data" / name).read_bytes(), name
    assert (a / "topology.json").read_bytes() == (b / "topology.json").read_bytes()
    ma, mb = (json.loads((d / "manifest.json").read_text()) for d in (a, b))
    assert {k: v for k, v in ma.items() if k not in _VARIES} == {
        k: v for k, v in mb.items() if k not in _VARIES
    }


@pytest.mark.parametrize(
    "config", [{}, {"keep_tokens": 3}, {"dump_statistics_mode": 0}, {"batch_bytes": 8192}]
)
def test_the_writer_process_writes_the_thread_writers_dump(tmp_path, monkeypatch, config):
    thread = _hf_run(tmp_path / "thread", "thread", monkeypatch, **config)
    process = _hf_run(tmp_path / "process", "process", monkeypatch, **config)
    _same_dump(thread, process)
    assert lwdump.index(process)[-1]["k"] == "end"


def test_inference_mode_tensors_are_copied_each_time_by_both_writers(tmp_path, monkeypatch):
    """Inference-mode tensors have no version counter: the records path (capture/recorder.py
    ``_record_one``) must copy each one, as the items path does, never alias it."""
    thread = _hf_run(tmp_path / "thread", "thread", monkeypatch, grad_mode=torch.inference_mode)
    process = _hf_run(tmp_path / "process", "process", monkeypatch, grad_mode=torch.inference_mode)
    _same_dump(thread, process)
    lines = [r for r in lwdump.index(process) if r["k"] == "t"]
    assert len({(r["file"], r["begin"]) for r in lines}) == len(lines)  # every line its own bytes


@pytest.mark.parametrize("config", [{}, {"keep_tokens": 3}, {"batch_bytes": 8192}])
@pytest.mark.parametrize("spawn_after", [1, 40, 200, 400])
def test_a_hand_over_in_the_middle_of_a_run_writes_the_thread_writers_dump(
    tmp_path, monkeypatch, config, spawn_after
):
    thread = _hf_run(tmp_path / "thread", "thread", monkeypatch, **config)
    handed = _hf_run(tmp_path / "handover", "handover", monkeypatch, spawn_after, **config)
    _same_dump(thread, handed)
    assert lwdump.index(handed)[-1]["k"] == "end"


def test_a_writer_process_started_ahead_takes_a_short_run_at_its_first_batch(tmp_path, monkeypatch):
    """A writer process started ahead (``layerwatch dump``'s processes start one when torch is
    imported): the first capture takes it and hands over at once, in a run far too short to
    start one (``spawn_after``), and it writes the thread writer's dump."""
    thread = _hf_run(tmp_path / "thread", "thread", monkeypatch)
    ahead = _hf_run(tmp_path / "ahead", "ahead", monkeypatch, spawn_after=1 << 30)
    _same_dump(thread, ahead)


def test_a_short_run_never_starts_the_writer_process(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)  # the default
    model = Wide()
    with register_hook(model, DumpConfig(dump_path=tmp_path)) as handle, torch.no_grad():
        for _ in range(3):
            model(torch.randn(128, 128))
    writer = handle._writer
    assert isinstance(writer, ProcessWriter) and writer._proc is None and not writer.remote
    assert lwdump.index(handle.run_dir)[-1] == {
        "k": "end", "status": "complete", "tokens": 3, "tensors": 27
    }  # fmt: skip


def test_on_one_cpu_the_thread_writes_the_whole_run(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(ProcessWriter, "spawn_after", 1)
    cpus = os.sched_getaffinity(0)
    model = Wide()
    x = torch.randn(128, 128)
    os.sched_setaffinity(0, {min(cpus)})
    try:
        with register_hook(model, DumpConfig(dump_path=tmp_path)) as handle, torch.no_grad():
            for _ in range(3):
                model(x)
                assert handle.flush(timeout=60)
    finally:
        os.sched_setaffinity(0, cpus)
    writer = handle._writer
    assert isinstance(writer, ProcessWriter) and writer._proc is None and writer.local
    assert lwdump.index(handle.run_dir)[-1]["status"] == "complete"


def test_on_a_busy_box_the_writer_process_still_starts(tmp_path, monkeypatch):
    """A loaded box with two cores (cpus.second_core): the process is one more task
    to share the cores with, where a thread would take the model's GIL."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(ProcessWriter, "spawn_after", 1)
    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores")
    model = Wide()
    with register_hook(model, DumpConfig(dump_path=tmp_path)) as handle, torch.no_grad():
        for _ in range(3):
            model(torch.randn(128, 128))
            assert handle.flush(timeout=60)
    writer = handle._writer
    assert isinstance(writer, ProcessWriter) and writer._proc is not None and not writer.local
    assert lwdump.index(handle.run_dir)[-1]["status"] == "complete"


def test_a_run_that_ends_before_the_hand_over_kills_the_process_and_never_waits(
    tmp_path, monkeypatch
):
    from layerwatch.capture import writer_process

    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(ProcessWriter, "spawn_after", 1)
    monkeypatch.setattr(writer_process, "second_core", lambda: True)  # whatever the box
    # a process that never comes up (as one still importing under load would)
    monkeypatch.setattr(writer_process, "_CHILD", "import time; time.sleep(120)")
    model = Wide()
    x = torch.randn(128, 128)
    with register_hook(model, DumpConfig(dump_path=tmp_path)) as handle, torch.no_grad():
        for _ in range(4):
            model(x)
            assert handle.flush(timeout=60)  # one batch each: the process starts after the first
        proc = handle._writer._proc  # type: ignore[union-attr]
        assert proc is not None and proc.poll() is None
        start = time.monotonic()
    waited = time.monotonic() - start
    assert proc.returncode == -signal.SIGKILL and waited < 10  # killed and reaped, not awaited
    assert not Path(f"/proc/{proc.pid}").exists()
    writer = handle._writer
    assert not writer.remote and writer.items_here > 0  # type: ignore[union-attr]
    run = handle.run_dir
    assert not list(run.rglob(".tmp-*"))  # type: ignore[union-attr]
    lines = lwdump.index(run)
    assert {ln["token"] for ln in lines if ln["k"] == "t"} == {0, 1, 2, 3}
    assert lines[-1] == {"k": "end", "status": "complete", "tokens": 4, "tensors": 36}


@pytest.mark.parametrize("mode", ["process", "handover"])
def test_a_stopped_writer_process_makes_the_model_wait_within_the_bound(
    tmp_path, monkeypatch, mode
):
    writers.select(monkeypatch, mode)
    bound = 512 * 1024
    model = Wide()
    x = torch.randn(128, 128)
    handle = register_hook(
        model, DumpConfig(dump_path=tmp_path, queue_bytes=bound, dump_statistics_mode=0)
    )
    with torch.no_grad():
        for _ in range(2):  # handover: the thread writes the first, the process the second
            model(x)
            assert handle.flush(timeout=60)
        assert handle._writer.remote  # type: ignore[union-attr]
        pid = handle._writer._proc.pid  # type: ignore[union-attr]
        os.kill(pid, signal.SIGSTOP)  # a writer that makes no progress for half a second
        resume = threading.Timer(0.5, os.kill, (pid, signal.SIGCONT))
        resume.start()
        start = time.perf_counter()
        model(x)
        model(x)  # more than the bound waits to be written: the model must wait
        waited = time.perf_counter() - start
        resume.join()
        for _ in range(8):
            model(x)
    handle.close()
    assert handle.failed is None
    assert waited >= 0.4 and 0 < handle.queue_peak_bytes <= bound
    got = lwdump.tensors(handle.run_dir)
    assert {t for (t, _, _) in got} == set(range(12))
    last = lwdump.load(handle.run_dir, got[11, "root", "output"])
    assert torch.equal(last, model(x).detach())


@pytest.mark.parametrize("mode", ["process", "handover"])
def test_the_writer_process_killed_is_one_line_and_the_model_finishes(
    tmp_path, monkeypatch, capfd, mode
):
    writers.select(monkeypatch, mode)
    model = Wide()
    x = torch.randn(128, 128)
    handle = register_hook(model, DumpConfig(dump_path=tmp_path))
    with torch.no_grad():
        for _ in range(3):
            model(x)
            assert handle.flush(timeout=60)  # handover: the first batch here, then the process
        assert handle._writer.remote  # type: ignore[union-attr]
        before = lwdump.index(handle.run_dir)
        files = {p.name: p.read_bytes() for p in (handle.run_dir / "data").iterdir()}
        os.kill(handle._writer._proc.pid, signal.SIGKILL)  # type: ignore[union-attr]
        for _ in range(5):
            model(x)
    handle.close()
    err = [ln for ln in capfd.readouterr().err.splitlines() if ln.strip()]
    assert err == [
        "layerwatch: capture stopped: the writer process was killed (SIGKILL) "
        "(the model keeps running; tensors already written are intact)"
    ]
    assert handle.failed == err[0].removeprefix("layerwatch: ")
    after = lwdump.index(handle.run_dir)
    assert after[: len(before)] == before and after[-1]["k"] == "error"
    for name, data in files.items():
        assert (handle.run_dir / "data" / name).read_bytes() == data
    manifest = json.loads((handle.run_dir / "manifest.json").read_text())
    assert manifest["status"].startswith("error: capture stopped: the writer process was killed")


MODEL_KILLED = (
    writers.SELECT
    + """
import signal, sys, torch
select_writer(sys.argv[2])
from layerwatch.capture import DumpConfig, register_hook
model = torch.nn.Sequential(*(torch.nn.Linear(16, 16) for _ in range(4)))
handle = register_hook(model, DumpConfig(dump_path=sys.argv[1]))
with torch.no_grad():
    for _ in range(5):
        model(torch.randn(2, 16))
        handle.flush()
assert handle._writer.remote
print(handle._writer._proc.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
)


@pytest.mark.parametrize("mode", ["process", "handover"])
def test_the_model_process_killed_lets_the_writer_process_end(tmp_path, mode):
    proc = subprocess.run(
        [sys.executable, "-c", MODEL_KILLED, str(tmp_path), mode],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL
    writer = int(proc.stdout.split()[0])
    deadline = time.monotonic() + 30
    while Path(f"/proc/{writer}").exists() and time.monotonic() < deadline:
        status = (
            Path(f"/proc/{writer}/stat").read_text().split()[2]
            if Path(f"/proc/{writer}/stat").exists()
            else "X"
        )
        if status == "Z":  # ended; its parent died, so only init reaps it
            break
        time.sleep(0.05)
    assert time.monotonic() < deadline, "the writer process is still running"
    run = lwdump.rank_dir(tmp_path)
    tokens = {t for (t, _, _) in lwdump.tensors(run)}
    assert tokens == set(range(5))  # everything flushed before the kill is on disk


@pytest.mark.parametrize("mode", ["process", "handover"])
def test_a_writer_process_that_cannot_start_leaves_the_writing_to_this_process(
    tmp_path, monkeypatch, mode
):
    from layerwatch.capture import writer_process

    writers.select(monkeypatch, mode)
    monkeypatch.setattr(writer_process, "_CHILD", "import sys; sys.exit(3)")  # no layerwatch there
    model = Wide()
    x = torch.randn(128, 128)
    with register_hook(model, DumpConfig(dump_path=tmp_path)) as handle, torch.no_grad():
        for _ in range(3):
            model(x)
            assert handle.flush(timeout=60)
    assert handle.failed is None and handle._writer.local  # type: ignore[union-attr]
    assert handle._writer._proc.returncode is not None  # type: ignore[union-attr]
    lines = lwdump.index(handle.run_dir)
    assert {ln["token"] for ln in lines if ln["k"] == "t"} == {0, 1, 2}
    assert lines[-1] == {"k": "end", "status": "complete", "tokens": 3, "tensors": 27}


class Big(nn.Module):
    """Arrays above stats.SMALL (reduced in the model process) beside small ones, a NaN in
    one of each at odd steps (their exact statistics)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(128, 512)
        self.down = nn.Linear(512, 8)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        h = self.up(x)
        if self.calls % 2:
            h = h.clone()
            h[0, 0] = float("nan")
        y = self.down(h)
        return y if self.calls % 2 == 0 else y.masked_fill(y > 0.5, float("-inf"))


def _big_run(out: Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    monkeypatch.setenv(ENV, mode)
    torch.manual_seed(0)
    model = Big()
    x = torch.randn(256, 128)  # 131 072 elements: large; the output 2 048: small
    maps = ""
    with register_hook(model, DumpConfig(dump_path=out, flush_interval=600.0)) as handle:
        with torch.no_grad():
            for _ in range(4):
                model(x)
                handle.flush()
        proc = getattr(handle._writer, "_proc", None)
        if proc is not None:
            maps = Path(f"/proc/{proc.pid}/maps").read_text()
    assert handle.failed is None
    return handle.run_dir, maps  # type: ignore[return-value]


def test_large_arrays_and_non_finite_ones_write_the_same_without_torch_there(tmp_path, monkeypatch):
    thread, _ = _big_run(tmp_path / "thread", "thread", monkeypatch)
    process, maps = _big_run(tmp_path / "process", "process", monkeypatch)
    _same_dump(thread, process)
    assert maps and "libtorch" not in maps  # the writer process never imported torch
    stats = [ln["stats"] for ln in lwdump.index(process) if ln["k"] == "t" and ln["stats"]]
    assert any(st["nan"] for st in stats) and any(st["inf"] for st in stats)
