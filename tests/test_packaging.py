"""The installed copy: one namespace in site-packages, data files shipped, CLI works from it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip install --no-deps --target`` a fresh, non-editable copy of the project."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-compile",
            "--target",
            str(target),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return target


def test_only_the_layerwatch_namespace_lands_at_the_top(installed: Path) -> None:
    top = {p.name for p in installed.iterdir() if not p.name.endswith(".dist-info")}
    assert top - {"bin"} == {"layerwatch"}, top
    assert not {"engine", "capture", "tui"} & top
    package = installed / "layerwatch"
    assert {p.name for p in package.iterdir() if p.is_dir()} >= {"capture", "engine", "tui"}


def test_data_files_ship_with_the_packages(installed: Path) -> None:
    package = installed / "layerwatch"
    bootstrap = package / "capture" / "bootstrap"
    # The bootstrap directory goes on the child's PYTHONPATH: it must hold nothing that could
    # shadow a user's module, i.e. only sitecustomize.py.
    assert [p.name for p in bootstrap.iterdir() if p.suffix == ".py"] == ["sitecustomize.py"]
    assert (package / "engine" / "thresholds.toml").is_file()
    assert list((package / "tui").glob("*.tcss"))


def test_the_installed_copy_runs_from_outside_the_repository(
    installed: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": str(installed)}
    code = (
        "import layerwatch.engine.numerics.thresholds as t, layerwatch.capture.format, layerwatch.tui.cli;"
        "t.Thresholds.load(); print(t.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip().startswith(str(installed))
    help_out = subprocess.run(
        [sys.executable, "-m", "layerwatch.tui", "--help"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "compare" in help_out.stdout
