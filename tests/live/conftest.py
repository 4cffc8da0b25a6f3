"""Fixtures for the live tests: a stand-in ``msit`` first on PATH."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

FAKE_MSIT = Path(__file__).with_name("fake_msit.py")


@pytest.fixture
def fake_msit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Put an executable ``msit`` (the stand-in) first on PATH; returns its bin directory."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    exe = bin_dir / "msit"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_MSIT}" "$@"\n')
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    return bin_dir


@pytest.fixture(scope="session")
def tiny_dumps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Finished dumps of the tiny program through ``layerwatch dump`` (made once): golden with
    the default arguments, target with a fault in layer 0."""
    from live.helpers import TINY, layerwatch

    root = tmp_path_factory.mktemp("tiny-dumps")
    golden, target = root / "golden", root / "target"
    done = layerwatch("dump", "--out", str(golden), "--", sys.executable, str(TINY))
    assert done.returncode == 0, done.stdout + done.stderr
    done = layerwatch(
        "dump", "--out", str(target), "--", sys.executable, str(TINY), "--fault-layer", "0"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return golden, target
