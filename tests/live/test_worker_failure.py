"""The engine worker failing for real: the pipeline still ends, once, with one line.

The failure comes from a corrupt file, not from patching: two real captures with their weights
dumped (``DumpConfig(dump_weight=True)``), the golden data file cut short, and ``--auto-map``
(pairing by weights). Reading the weights for the pairing raises ``LayerwatchError``
(truncated) inside ``session.flush()`` — every later flush would too. ``layerwatch compare``
stops with the same one line and exit 2. (If pairing ever turns an unreadable weight file into
a note instead, these tests need another real failure inside the worker.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from layerwatch.engine.live.pipeline import LivePipeline, attach_spec
from layerwatch.engine.session.core import CompareSession
from live.helpers import layerwatch
from support.broken_dumps import truncated_weight_dumps


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return truncated_weight_dumps(tmp_path_factory.mktemp("weights"))


def test_worker_failure_ends_with_a_done_batch_and_a_note(dumps: tuple[Path, Path]) -> None:
    golden, target = dumps
    pipeline = LivePipeline(
        attach_spec(golden, idle_s=0, watch=False),
        attach_spec(target, idle_s=0, watch=False),
        session=CompareSession(auto_map=True),
    )
    pipeline.start()
    try:
        assert pipeline.wait(60), (
            "the worker never said it was done: a front end would wait forever"
        )
    finally:
        pipeline.stop()
    batches = pipeline.sink.drain()
    assert pipeline.error is not None
    assert pipeline.error.startswith("live pipeline stopped: LayerwatchError: ")
    assert "truncated" in pipeline.error and "\n" not in pipeline.error
    assert [b.done for b in batches].count(True) == 1 and batches[-1].done
    assert pipeline.error in batches[-1].notes
    assert pipeline.error in pipeline.notes
    # What was read before the comparison failed is still there for the front end.
    assert pipeline.session.progress() == {"golden": (2, 16), "target": (2, 16)}


def test_headless_open_exits_2_with_the_workers_line(dumps: tuple[Path, Path]) -> None:
    golden, target = dumps
    proc = layerwatch("open", "--headless", "--auto-map", str(golden), str(target), timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert lines[-1].startswith("layerwatch open: live pipeline stopped: LayerwatchError: "), lines
    assert "truncated" in lines[-1]
    assert sum("live pipeline stopped" in line for line in lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""  # no summary of a comparison that did not happen


def test_compare_says_the_same(dumps: tuple[Path, Path]) -> None:
    """The control: the one-shot path stops on the same file with exit 2."""
    golden, target = dumps
    proc = layerwatch("compare", "--auto-map", str(golden), str(target), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "truncated" in proc.stderr.strip().splitlines()[-1]
