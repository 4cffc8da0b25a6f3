"""Helpers for the live tests: run the CLI, read our dumps back, check processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROGRAMS = Path(__file__).with_name("programs")
TINY = PROGRAMS / "tiny_infer.py"


def layerwatch(*args: str, timeout: float = 90, env: dict[str, str] | None = None,
               cwd: str | Path | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """``layerwatch ARGS`` in a fresh process (as a user runs it)."""
    return subprocess.run(
        [sys.executable, "-m", "layerwatch.tui", *args],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd,
    )  # fmt: skip


def index_records(out: Path) -> list[dict]:
    """Every complete index line of every rank dir under ``out``."""
    records = []
    for index in sorted(out.glob("*/index.jsonl")):
        for line in index.read_text().splitlines():
            if line.endswith("}"):
                records.append(json.loads(line))
    return records


def payload(out: Path, rec: dict) -> bytes:
    rank = next(p.parent for p in out.glob("*/index.jsonl"))
    with open(rank / rec["file"], "rb") as fh:
        fh.seek(rec["begin"])
        return fh.read(rec["end"] - rec["begin"])


def is_running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie may linger where pid 1 does not reap)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def env_with(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env
