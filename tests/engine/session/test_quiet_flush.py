"""A headless compare's sessions build no batch (engine/session/core.py ``flush(batch=False)``,
engine/session/windowed.py): their results, findings and grid are those of a session that does."""

from __future__ import annotations

from layerwatch.engine.readers import open_dump
from layerwatch.engine.session.core import CompareSession

from tests.conftest import MSIT_FIXTURES


def _updates() -> dict:
    return {
        side: open_dump(str(MSIT_FIXTURES / side), side=side).poll(None, final=True)
        for side in ("golden", "target")
    }


def test_no_batch_same_results_findings_and_cells() -> None:
    loud, quiet = CompareSession(jobs=1), CompareSession(jobs=1)
    try:
        batch = loud.compare_finished(*_updates().values())
        assert batch is not None and batch.cells and batch.first_failure is not None
        assert quiet.compare_finished(*_updates().values(), batch=False) is None
        rows = [(r.key, r.verdict, r.metrics, r.reason) for r in loud.results()]
        assert rows == [(r.key, r.verdict, r.metrics, r.reason) for r in quiet.results()]
        assert quiet.first_failure == loud.first_failure
        assert quiet.root_cause == loud.root_cause
        assert quiet.first_bad_token == loud.first_bad_token
        assert quiet.summary == loud.summary
        assert quiet.cells() == loud.cells()  # the quiet session's cells, aggregated when asked
    finally:
        loud.close()
        quiet.close()


def test_a_sink_still_gets_its_batch() -> None:
    got = []

    class Sink:
        def on_batch(self, batch: object) -> None:
            got.append(batch)

    session = CompareSession(jobs=1, sink=Sink())
    try:
        batch = session.compare_finished(*_updates().values(), batch=False)
        assert batch is not None and got == [batch] and batch.pairs
    finally:
        session.close()
