"""Session-wide test setup shared by every area."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

MSIT_FIXTURES = Path(__file__).parent / "fixtures" / "msit"


@pytest.fixture(scope="session", autouse=True)
def msit_fixture_times() -> None:
    """Give the msit fixture files the modification times msit wrote them with.

    msit's dumps carry no execution order: readers derive it from file times. A git checkout
    writes files in path order, so a fresh clone would present an alphabetical "execution".
    The times recorded when the fixtures were made (``mtimes.json``) are put back first.
    """
    recorded = json.loads((MSIT_FIXTURES / "mtimes.json").read_text(encoding="utf-8"))
    for rel, mtime_ns in recorded.items():
        path = MSIT_FIXTURES / rel
        if path.exists() and path.stat().st_mtime_ns != mtime_ns:
            os.utime(path, ns=(mtime_ns, mtime_ns))


@pytest.fixture(autouse=True)
def kernel_count_per_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test counts the elements that load the compiled metric kernel from 0
    (engine/numerics/fused.py ``kernel_for(..., running=True)``), and gives the count back after.

    The kernel's last digits differ from the numpy path's, and a count carried over from earlier
    tests (how many depends on the order, and on how many forked at the box's load) would load it
    part-way through a test: two reports of the same dumps then differed in one digit."""
    from layerwatch.engine.numerics import fused

    monkeypatch.setitem(fused._STATE, "seen", 0)
