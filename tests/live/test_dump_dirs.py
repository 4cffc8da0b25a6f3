"""``watch``/``run --golden DIR`` on msit's output directory: the newest run, said in a note.

A live dump is being written into a new ``msit_dump_{timestamp}`` next to older runs, so the
live pipeline follows the newest one (``compare``/``open`` refuse to guess: see
``tests/engine/readers/test_dump_path.py``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from live.helpers import layerwatch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "msit"


def test_watch_follows_the_newest_msit_run_and_says_so(tmp_path: Path) -> None:
    golden = tmp_path / "golden"
    shutil.copytree(FIXTURES / "golden" / "msit_dump_fixture", golden / "msit_dump_20250101_1")
    newest = golden / "msit_dump_20250102_1"
    shutil.copytree(FIXTURES / "target" / "msit_dump_fixture", newest)  # the faulty one
    target = FIXTURES / "target"
    proc = layerwatch("watch", "--headless", "--idle", "1", str(golden), str(target), timeout=90)
    note = f"golden: {golden} holds 2 msit dumps: following the newest, {newest.name}"
    assert proc.stdout.count(note) == 1, proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stderr  # the newest run equals the target: all pass
