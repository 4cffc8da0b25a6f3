"""``layerwatch dump`` on real commands: zero code change, exit codes, logs, crashes, limits."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import pytest
from live.helpers import TINY, env_with, index_records, layerwatch, payload


def _run_direct(*args: str) -> tuple[int, str]:
    import subprocess

    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr


def test_unmodified_program_same_output_and_exit_code(tmp_path: Path) -> None:
    """One user project: its own ``engine``/``capture`` modules and its own sitecustomize."""
    proj, site = tmp_path / "proj", tmp_path / "usersite"
    (proj / "capture").mkdir(parents=True)
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os\nos.environ['USER_SITE_RAN'] = 'yes'\nprint('user sitecustomize')\n"
    )
    (proj / "engine.py").write_text("WHO = 'user engine'\n")
    (proj / "capture" / "__init__.py").write_text("WHO = 'user capture'\n")
    (proj / "main.py").write_text(
        "import os, sys, runpy, engine, capture\n"
        "print(engine.WHO, '|', capture.WHO, '| site', os.environ.get('USER_SITE_RAN'))\n"
        f"sys.argv = ['x', '--exit-code', '3']\nrunpy.run_path({str(TINY)!r}, run_name='__main__')\n"
    )
    env = env_with(PYTHONPATH=str(site))
    out = tmp_path / "dump"
    done = layerwatch("dump", "--out", str(out), "--", sys.executable, "main.py", cwd=proj, env=env)
    assert done.returncode == 3, done.stderr
    # (layerwatch's own interpreter ran the user's sitecustomize too: it printed a line)
    summary = [line for line in done.stdout.splitlines() if line != "user sitecustomize"]
    assert len(summary) == 1 and "exited with code 3" in summary[0] and "4 tokens" in summary[0]
    import subprocess

    direct = subprocess.run(
        [sys.executable, "main.py"], cwd=proj, env=env, capture_output=True, text=True, timeout=60
    )
    assert direct.returncode == 3
    log = (out / "layerwatch.log").read_text()
    assert sorted(log.splitlines()) == sorted((direct.stdout + direct.stderr).splitlines())
    assert "user sitecustomize" in log and "user engine | user capture | site yes" in log
    assert "generated" not in done.stdout + done.stderr.split("\n  |")[0]  # not on our terminal
    tokens = [r for r in index_records(out) if r["k"] == "token"]
    assert [t["token"] for t in tokens] == [0, 1, 2, 3]


def test_capture_equals_register_hook_in_process(
    tmp_path: Path, tiny_dumps: tuple[Path, Path]
) -> None:
    """The zero-code path names, counts and captures exactly what register_hook does."""
    auto, manual = tiny_dumps[0], tmp_path / "manual"
    code = textwrap.dedent(f"""
        import sys, runpy, torch
        from layerwatch.capture import DumpConfig, register_hook
        real_init = torch.nn.Module.__init__
        sys.argv = [{str(TINY)!r}]
        ns = runpy.run_path({str(TINY)!r})
        TinyLM = ns["TinyLM"]
        torch.manual_seed(0)
        model = TinyLM().eval()
        handle = register_hook(model, DumpConfig(dump_path={str(manual)!r}))
        ids = torch.tensor([[1, 2, 3]])
        with torch.no_grad():
            for step in range(4):
                logits = model(input_ids=ids if step == 0 else ids[:, -1:])
                ids = torch.cat([ids, logits[:, -1:].argmax(-1)], dim=1)
        handle.close()
    """)
    import subprocess

    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    # Index lines may come in another order (writer batching); what they say must be the same.
    key = lambda r: (r["token"], r["k"], r.get("order", -1), r.get("node", ""), r.get("stem", ""))  # noqa: E731
    a = sorted((r for r in index_records(auto) if r["k"] != "end"), key=key)
    m = sorted((r for r in index_records(manual) if r["k"] != "end"), key=key)
    strip = lambda r: {k: v for k, v in r.items() if k not in ("file", "begin", "end")}  # noqa: E731
    assert [strip(r) for r in a] == [strip(r) for r in m]
    tensors = [(ra, rm) for ra, rm in zip(a, m, strict=True) if ra["k"] == "t" and ra["file"]]
    assert tensors and all(payload(auto, ra) == payload(manual, rm) for ra, rm in tensors)
    assert any(r["k"] == "token" and r["input_ids"] == [1, 2, 3] for r in a)


def test_program_without_torch_loads_nothing_of_ours(tmp_path: Path) -> None:
    code = (
        "import sys; print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('layerwatch') or m == 'json'));"
        "print(any('bootstrap' in p for p in sys.path))"
    )
    out = tmp_path / "dump"
    done = layerwatch("dump", "--out", str(out), "--", sys.executable, "-c", code)
    assert done.returncode == 0
    assert (out / "layerwatch.log").read_text().split() == ["[]", "False"]
    assert "nothing captured" in done.stdout


def test_command_not_found(tmp_path: Path) -> None:
    done = layerwatch(
        "dump", "--out", str(tmp_path / "d"), "--", "no-such-command-xyz", "--flag", timeout=30
    )
    assert done.returncode == 127
    assert done.stderr.strip() == "layerwatch dump: command not found: no-such-command-xyz"


def test_child_exits_nonzero_at_once(tmp_path: Path) -> None:
    done = layerwatch(
        "dump",
        "--out",
        str(tmp_path / "d"),
        "--",
        sys.executable,
        "-c",
        "import sys; print('bad args'); sys.exit(5)",
    )
    assert done.returncode == 5
    assert "exited with code 5: bad args" in done.stdout
    assert "  | bad args" in done.stderr


def test_crash_mid_dump_keeps_what_landed(tmp_path: Path) -> None:
    out = tmp_path / "d"
    done = layerwatch("dump", "--out", str(out), "--", sys.executable, str(TINY), "--crash-at", "2")
    assert done.returncode == 1
    assert "RuntimeError: boom at token 2" in done.stdout
    records = index_records(out)
    assert {r["token"] for r in records if r["k"] == "t"} == {0, 1}
    assert all(
        len(payload(out, r)) == r["end"] - r["begin"]
        for r in records
        if r["k"] == "t" and r["file"]
    )


def test_shell_mode(tmp_path: Path) -> None:
    out = tmp_path / "d"
    code = "import os; print('settings', bool(os.environ.get('LAYERWATCH_CAPTURE')))"
    done = layerwatch(
        "dump", "--shell", "--out", str(out), "--", f'{sys.executable} -c "{code}" | tr a-z A-Z'
    )
    assert done.returncode == 0, done.stdout
    assert (out / "layerwatch.log").read_text().strip() == "SETTINGS TRUE"


def test_file_size_limit_hit_mid_dump(tmp_path: Path) -> None:
    """RLIMIT_FSIZE in the child with SIGXFSZ ignored: writes fail with EFBIG mid-dump."""
    out = tmp_path / "d"
    code = textwrap.dedent(f"""
        import resource, runpy, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, 60_000))
        sys.argv = ["tiny", "--tokens", "12", "--dim", "64", "--sleep", "0.3"]  # one token per write
        runpy.run_path({str(TINY)!r}, run_name="__main__")
    """)
    done = layerwatch("dump", "--out", str(out), "--", sys.executable, "-c", code)
    assert done.returncode == 0, done.stdout  # the model keeps running
    assert "file size limit" in done.stdout
    records = [r for r in index_records(out) if r["k"] == "t" and r["file"]]
    assert records
    assert all(len(payload(out, r)) == r["end"] - r["begin"] for r in records)
    assert max(r["token"] for r in records) < 11  # capture stopped before the end
    from layerwatch.engine.readers import open_dump
    from layerwatch.engine.readers.load import load_array

    update = open_dump(out).poll(None)  # what landed stays readable by the engine
    assert len(update.tensors) == len(records)
    assert all(load_array(t.loc).shape == t.shape for t in update.tensors if t.loc is not None)


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_signal_forwarded_to_child_data_kept(tmp_path: Path, signame: str) -> None:
    import signal
    import subprocess

    out = tmp_path / "d"
    proc = subprocess.Popen(
        [sys.executable, "-m", "layerwatch.tui", "dump", "--out", str(out), "--", sys.executable, str(TINY), "--tokens", "500", "--sleep", "0.05"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while (
            time.monotonic() < deadline
            and len([r for r in index_records(out) if r["k"] == "token"]) < 3
        ):
            time.sleep(0.05)
        proc.send_signal(getattr(signal, signame))
        stdout, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    expected = 128 + getattr(signal, signame)
    assert proc.returncode in (expected, 1), stdout  # killed by the signal, or Python's exit 1
    assert f"killed by {signame}" in stdout or "exited with code 1" in stdout
    tokens = {r["token"] for r in index_records(out) if r["k"] == "t"}
    assert len(tokens) >= 3


def test_bootstrap_dir_holds_only_the_bootstrap() -> None:
    from layerwatch.capture.launch import BOOTSTRAP_DIR

    assert sorted(p.name for p in BOOTSTRAP_DIR.iterdir() if p.name != "__pycache__") == [
        "sitecustomize.py"
    ]
    assert os.path.basename(BOOTSTRAP_DIR) == "bootstrap"


HF_GENERATE = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
model = LlamaForCausalLM(cfg).eval()
out = model.generate(torch.tensor([[1, 5, 7, 9]]), max_new_tokens=4, do_sample=False, pad_token_id=0)
print(*out[0].tolist())
"""


@pytest.mark.slow
def test_hf_generate_root_is_the_causal_lm(tmp_path: Path) -> None:
    """HF ``generate`` calls the model with keyword arguments: the root found by itself is
    ``LlamaForCausalLM``, each decode step is a token and its input ids are recorded."""
    import json

    script = tmp_path / "gen.py"
    script.write_text(HF_GENERATE)
    out = tmp_path / "d"
    done = layerwatch("dump", "--out", str(out), "--", sys.executable, str(script), timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    ids = [int(x) for x in (out / "layerwatch.log").read_text().split()]
    tokens = [r for r in index_records(out) if r["k"] == "token"]
    assert [t["input_ids"] for t in tokens] == [ids[:4], *[[i] for i in ids[4:-1]]]
    manifest = json.loads(next(out.glob("*/manifest.json")).read_text())
    assert manifest["model"] == "LlamaForCausalLM"
    nodes = {r["node"] for r in index_records(out) if r["k"] == "t"}
    assert "root.model.layers.1.mlp.down_proj" in nodes and "root.lm_head" in nodes


def test_worker_processes_each_dump_their_own_rank(tmp_path: Path) -> None:
    """Like torchrun: a launcher process (no torch) starts two workers; both inherit the
    bootstrap through the environment and each writes its own rank dir; ``open`` compares the
    two ranks of this run with the two ranks of the same run again (one side = both ranks)."""
    launcher = (
        "import subprocess, sys\n"
        f"procs = [subprocess.Popen([sys.executable, {str(TINY)!r}]) for _ in range(2)]\n"
        "sys.exit(max(p.wait() for p in procs))\n"
    )
    runs = []
    for name in ("a", "b"):
        out = tmp_path / name
        done = layerwatch("dump", "--out", str(out), "--", sys.executable, "-c", launcher)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "4 tokens, 240 tensors from 2 processes" in done.stdout
        assert len(list(out.glob("cpu_*/index.jsonl"))) == 2
        runs.append(out)
    opened = layerwatch("open", "--headless", str(runs[0]), str(runs[1]))
    assert opened.returncode == 0, opened.stdout + opened.stderr
    assert "pairs: 240 compared · 240 pass" in opened.stdout
