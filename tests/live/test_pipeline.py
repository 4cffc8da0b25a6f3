"""The live pipeline end to end: real commands, real files, the real session."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from layerwatch.capture.launch import CaptureOptions, LaunchSpec
from layerwatch.engine.live.pipeline import LivePipeline, SideSpec, attach_spec
from live.conftest import FAKE_MSIT
from live.helpers import TINY, env_with, index_records, is_running, layerwatch


def _drain_until_done(pipeline: LivePipeline, timeout: float = 60) -> list:
    batches = []
    deadline = time.monotonic() + timeout
    while not pipeline.wait(0.05):
        batches += pipeline.sink.drain()
        assert time.monotonic() < deadline, "the pipeline did not finish"
    return batches + pipeline.sink.drain()


def _msit_side(out: Path, **env: str) -> SideSpec:
    launch = LaunchSpec(["sleep", "0"], out, CaptureOptions(), dumper="msit", env=env_with(**env))
    return SideSpec(out, launch)


def test_run_headless_reports_first_failure_while_target_still_runs(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "layerwatch.tui", "run", "--headless", "--out", str(tmp_path / "run"),
         "--golden-cmd", f"{sys.executable} {TINY}",
         "--target-cmd", f"{sys.executable} {TINY} --fault-layer 1 --sleep 0.6"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 1, out
    first = out.index("first failure: token 0 · layer 1 · mlp.2")
    assert first < out.index("layerwatch: target: exited with code 0"), out  # live, not at the end
    assert "root cause:      token 0 · layer 1 · mlp.2" in out
    assert "pairs: 120 compared" in out
    assert (tmp_path / "run" / "golden.log").read_text().startswith("generated")


def test_open_headless_matches_compare(tmp_path: Path, tiny_dumps: tuple[Path, Path]) -> None:
    golden, target = tiny_dumps
    opened = layerwatch("open", "--headless", str(golden), str(target))
    compared = layerwatch("compare", str(golden), str(target))
    assert opened.returncode == compared.returncode == 1
    assert opened.stdout == compared.stdout
    as_json = layerwatch(
        "open", "--headless", "--json", "-o", str(tmp_path / "r.csv"), str(golden), str(target)
    )
    assert as_json.stdout == layerwatch("compare", "--json", str(golden), str(target)).stdout
    assert (tmp_path / "r.csv").read_text().count("\n") == 121


def test_attach_to_finished_dump_and_launch_the_other(
    tmp_path: Path, tiny_dumps: tuple[Path, Path]
) -> None:
    golden = tiny_dumps[0]
    launch = LaunchSpec([sys.executable, str(TINY)], tmp_path / "t")
    pipeline = LivePipeline(attach_spec(golden, idle_s=60), SideSpec(tmp_path / "t", launch))
    pipeline.start()
    try:
        batches = _drain_until_done(pipeline)  # golden finishes on its end marker, not after 60 s
    finally:
        pipeline.stop()
    summary = pipeline.session.summary
    assert summary.pairs == 120 and summary.passed == 120
    golden_states = [b.runs["golden"].state for b in batches if "golden" in b.runs]
    target_states = [b.runs["target"].state for b in batches if "target" in b.runs]
    assert golden_states[-1] == "complete"  # its end marker was read
    assert target_states[0] == "running" and target_states[-1] == "exited"


def test_target_killed_mid_dump_keeps_what_landed(tmp_path: Path) -> None:
    golden = SideSpec(
        tmp_path / "g", LaunchSpec([sys.executable, str(TINY), "--tokens", "6"], tmp_path / "g")
    )
    target_launch = LaunchSpec(
        [sys.executable, str(TINY), "--tokens", "6", "--sleep", "0.4"], tmp_path / "t"
    )
    pipeline = LivePipeline(golden, SideSpec(tmp_path / "t", target_launch))
    pipeline.start()
    try:
        child = pipeline.sides["target"].child
        assert child is not None and child.pid is not None
        deadline = time.monotonic() + 60
        while len([r for r in index_records(tmp_path / "t") if r["k"] == "token"]) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
        batches = _drain_until_done(pipeline)
    finally:
        pipeline.stop()
    notes = [n for b in batches for n in b.notes]
    assert any("target command killed by SIGKILL" in n for n in notes), notes
    summary = pipeline.session.summary
    assert summary.passed >= 2 * 30 and summary.failed == 0  # tokens that landed are compared
    assert summary.unpaired > 0
    assert pipeline.failed_commands == [f"target command {child.describe()}"]


def test_command_that_does_not_exist(tmp_path: Path) -> None:
    done = layerwatch(
        "run",
        "--headless",
        "--out",
        str(tmp_path / "r"),
        "--golden-cmd",
        "no-such-binary-xyz",
        "--target",
        str(tmp_path),
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "layerwatch run: command not found: no-such-binary-xyz"


def test_msit_dumper_streams_atb_dump(tmp_path: Path, fake_msit: Path) -> None:
    """Both sides through the stand-in ``msit llm dump``: the ATB .bin files are written in
    place, header first; the first failure is found while the target is still dumping."""
    record = tmp_path / "args.json"
    golden = _msit_side(tmp_path / "g", FAKE_MSIT_TOKENS="3", FAKE_MSIT_DELAY="0")
    target = _msit_side(
        tmp_path / "t",
        FAKE_MSIT_TOKENS="3",
        FAKE_MSIT_DELAY="0.03",
        FAKE_MSIT_FAULT="1_LinearOperation",
        FAKE_MSIT_RECORD=str(record),
    )
    pipeline = LivePipeline(golden, target)
    pipeline.start()
    try:
        seen_first_while_running = False
        deadline = time.monotonic() + 60
        while not pipeline.wait(0.05):
            assert time.monotonic() < deadline
            for batch in pipeline.sink.drain():
                if (
                    batch.first_failure is not None
                    and pipeline.sides["target"].child.poll() is None
                ):
                    seen_first_while_running = True
    finally:
        pipeline.stop()
    first = pipeline.session.first_failure
    assert (
        first is not None
        and first.token == 0
        and first.node.endswith("1_DecoderLayer.1_LinearOperation")
    )
    assert seen_first_while_running
    summary = pipeline.session.summary
    assert (
        summary.error == 0 and summary.unpaired == 0 and summary.pairs == 3 * 18
    )  # 9 ops (children included) × in+out per token
    args = __import__("json").loads(record.read_text())
    assert args["argv"][:4] == ["llm", "dump", "--exec", "sleep 0"]
    assert args["execute_range"] == "0,1000000" and args["save_tensor_part"] == "2"


def test_watch_foreign_dumps_removed_dir_and_idle_finish(tmp_path: Path) -> None:
    """``watch`` two ATB dumps being written by other processes; the target directory is
    removed half-way (a message, no crash); the sides finish by the idle rule."""
    g, t = tmp_path / "g", tmp_path / "t"
    env = env_with(FAKE_MSIT_TOKENS="2", FAKE_MSIT_DELAY="0.01")
    writers = [
        subprocess.Popen(
            [
                sys.executable,
                str(FAKE_MSIT),
                "llm",
                "dump",
                "--exec",
                "sleep 0",
                "-er",
                "0,9",
                "-o",
                str(d),
            ],
            env=env,
        )
        for d in (g, t)
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "layerwatch.tui", "watch", "--headless", "--idle", "1.5", str(g), str(t)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert all(w.wait(timeout=60) == 0 for w in writers)
        time.sleep(0.3)
        shutil.rmtree(t)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert "target: " in out and "was removed while being watched" in out, out
    assert "Traceback" not in out
    assert proc.returncode == 0, out
    assert "pairs: 36 compared · 36 pass" in out


def test_interrupt_run_stops_children(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    slow = f"{sys.executable} -c \"import os, time; open('{pids}', 'a').write(str(os.getpid()) + chr(10)); time.sleep(300)\""
    proc = subprocess.Popen(
        [sys.executable, "-m", "layerwatch.tui", "run", "--headless", "--out", str(tmp_path / "r"),
         "--golden-cmd", slow, "--target-cmd", slow],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env_with(LAYERWATCH_GRACE="2"),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (pids.exists() and len(pids.read_text().split()) == 2):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, out
    assert all(not is_running(int(p)) for p in pids.read_text().split())


def test_stop_is_idempotent_from_any_thread(tmp_path: Path) -> None:
    launch = LaunchSpec([sys.executable, "-c", "import time; time.sleep(300)"], tmp_path / "t")
    pipeline = LivePipeline(
        attach_spec(tmp_path / "never", idle_s=60), SideSpec(tmp_path / "t", launch)
    )
    pipeline.start()
    pid = pipeline.sides["target"].child.pid
    stoppers = [threading.Thread(target=pipeline.stop) for _ in range(3)]
    started = time.monotonic()
    for s in stoppers:
        s.start()
    for s in stoppers:
        s.join(timeout=20)
    assert not any(s.is_alive() for s in stoppers)
    assert time.monotonic() - started < 10
    assert not is_running(pid)
    pipeline.stop()
    assert pipeline._worker is not None and not pipeline._worker.is_alive()


@pytest.mark.parametrize("fmt", ["msit"])
def test_run_with_msit_format_capture(tmp_path: Path, fmt: str) -> None:
    """``--format msit``: the launched child writes msit's .pth layout under msit_dump_*/."""
    done = layerwatch(
        "run", "--headless", "--format", fmt, "--out", str(tmp_path / "r"), "--tokens", "0-1",
        "--golden-cmd", f"{sys.executable} {TINY}", "--target-cmd", f"{sys.executable} {TINY}",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "pairs: 60 compared · 60 pass" in done.stdout


def test_dump_with_msit_dumper_maps_options(tmp_path: Path, fake_msit: Path) -> None:
    record = tmp_path / "args.json"
    env = env_with(FAKE_MSIT_RECORD=str(record), FAKE_MSIT_TOKENS="3")
    out = tmp_path / "d"
    done = layerwatch(
        "dump", "--dumper", "msit", "--out", str(out), "--tokens", "0-1", "--part", "out",
        "--layers", "Linear*", "--seed", "7", "--", "python3", "-c", "pass", env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    args = __import__("json").loads(record.read_text())
    assert args["argv"] == [
        "llm", "dump", "--exec", "python3 -c pass", "-o", str(out), "--type", "model", "tensor",
        "-er", "0,1", "-stp", "1", "-opname", "Linear", "-seed", "7",
    ]  # fmt: skip
    assert "exited with code 0 · 2 tokens, 4 tensors" in done.stdout  # outputs of 2 Linear ops x 2
    bad = layerwatch(
        "dump",
        "--dumper",
        "msit",
        "--out",
        str(out),
        "--",
        "python3",
        "-c",
        "print(1 + 1)",
        env=env,
    )
    assert bad.returncode == 2
    assert "msit llm dump splits --exec on spaces" in bad.stderr and "Traceback" not in bad.stderr
    logits = layerwatch(
        "dump", "--dumper", "msit", "--last-logits", "--out", str(out), "--", "true", env=env
    )
    assert logits.returncode == 2 and "do not apply to --dumper msit" in logits.stderr


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.parametrize(
    ("golden", "target"),
    [
        ("msit/golden/msit_dump_fixture", "msit/target/msit_dump_fixture"),
        (
            "msprobe/tensor_golden/step0/proc1000/dump.json",
            "msprobe/tensor_target/step0/proc2000/dump.json",
        ),
    ],
)
def test_open_foreign_dumps_matches_compare(golden: str, target: str) -> None:
    """Dumps written by msit and msprobe themselves (READERS' fixtures), a file path included."""
    g, t = str(FIXTURES / golden), str(FIXTURES / target)
    opened = layerwatch("open", "--headless", g, t)
    compared = layerwatch("compare", g, t)
    assert (opened.returncode, opened.stdout) == (compared.returncode, compared.stdout)
    assert "pairs:" in opened.stdout


def test_an_attached_dump_without_its_end_record_is_stopped_not_complete(
    tmp_path: Path, tiny_dumps: tuple[Path, Path]
) -> None:
    """A layerwatch dump whose run was killed has no end record: attached (``open``,
    ``watch``), its side is ``stopped`` with one note naming the directory, never
    ``complete``; what it wrote is still compared. A whole dump stays ``complete``."""
    golden, target = tiny_dumps
    cut = tmp_path / "killed"
    shutil.copytree(target, cut)
    for index in cut.glob("*/index.jsonl"):
        lines = index.read_text().splitlines(keepends=True)
        index.write_text("".join(line for line in lines if '"k":"end"' not in line))
    opened = layerwatch("open", "--headless", str(golden), str(cut))
    said = opened.stdout + opened.stderr
    assert "layerwatch: target: stopped" in said and "target: complete" not in said, said
    assert said.count(f"note: target: {cut} has no end record") == 2  # live, then the summary
    assert "golden: complete" in said and "golden: stopped" not in said
    assert opened.returncode == layerwatch("compare", str(golden), str(target)).returncode
    assert "pairs: 120 compared" in opened.stdout
