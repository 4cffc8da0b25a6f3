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
