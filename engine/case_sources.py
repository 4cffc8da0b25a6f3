"""Per-case dumps behind the TUI: the list of cases with their verdicts, and one case's grid.

``layerwatch open`` of two dumps with several cases (``capture/cases.py``) shows the cases first.
:class:`CaseSet` reads both finished dumps once and compares every case as ``compare`` does
(engine/cases.py: one session per case, tokens from 0, paired by key else by order); its rows
are what the cases list shows. :meth:`CaseSet.source` gives one case as a
:class:`~layerwatch.engine.seam.ComparisonSource`, so the grid, block and operator views show
it unchanged: its session is compared again in a thread (kept open for drill-down) and arrives
as one batch.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.cases import (
    CaseResult,
    CaseSpan,
    compare_cases,
    pair_cases,
    slice_update,
    spans,
)
from layerwatch.engine.readers.base import ReaderUpdate
from layerwatch.engine.seam import CaseRow, QueueSink, ResultBatch


def case_row(case: CaseResult) -> CaseRow:
    """The cases list's line for one compared case."""
    report = case.report
    summary = report.get("summary", {})
    ff = report.get("first_failure") or {}
    return CaseRow(
        case.key,
        case.verdict,
        report.get("first_bad_token"),
        str(ff.get("node", "")),
        int(summary.get("pairs", 0)),
        int(summary.get("fail", 0)) + int(summary.get("error", 0)),
    )


class CaseSet:
    """A :class:`~layerwatch.engine.seam.CasesView`: the cases of two finished dumps (``load`` compares them all; call it off the UI thread)."""

    def __init__(self, golden: str, target: str, make_session: Callable[[], Any]) -> None:
        self.golden, self.target = golden, target
        self.make_session = make_session
        self.rows: list[CaseRow] = []
        self._updates: dict[str, ReaderUpdate] = {}
        self._spans: dict[str, tuple[CaseSpan | None, CaseSpan | None]] = {}
        self._sources: dict[str, CaseSource] = {}

    def load(self) -> list[CaseRow]:
        from layerwatch.engine.readers import open_dump

        self._updates = {
            side: open_dump(path, side=side).poll(None, final=True)
            for side, path in (("golden", self.golden), ("target", self.target))
        }
        whole = {
            side: spans(u.case_marks) or [CaseSpan("0", 0, None)]
            for side, u in self._updates.items()
        }
        self._spans = {k: (g, t) for k, g, t in pair_cases(whole["golden"], whole["target"])}
        cases = compare_cases(self._updates, self.make_session)
        if not any(c.results for c in cases):
            raise LayerwatchError("nothing to compare: no case has tensors on both sides")
        self.rows = [case_row(c) for c in cases]
        return self.rows

    @property
    def failing(self) -> int:
        return sum(1 for r in self.rows if r.verdict == "fail")

    def source(self, key: str) -> CaseSource:
        """The case ``key`` as a comparison source (the same one each time it is asked for)."""
        found = self._sources.get(key)
        if found is None:
            golden, target = self._spans.get(key, (None, None))
            if golden is None or target is None:
                raise LayerwatchError(f"case {key!r} is on one side only: nothing to compare")
            found = CaseSource(
                key,
                slice_update(self._updates["golden"], golden),
                slice_update(self._updates["target"], target),
                self.make_session(),
            )
            self._sources[key] = found
        return found

    def close(self) -> None:
        for source in self._sources.values():
            source.stop()


class CaseSource:
    """One case of a per-case pair as a finished comparison (a ``ComparisonSource``)."""

    def __init__(self, key: str, golden: ReaderUpdate, target: ReaderUpdate, session: Any) -> None:
        self.key = key
        self.session = session
        self.view = session
        self.sink = QueueSink()
        self.error: str | None = None
        self._updates = (golden, target)
        self._thread: threading.Thread | None = None
        self._batch: ResultBatch | None = None

    def start(self) -> None:
        """Compare the case in a thread; a second start replays its batch (the grid is new)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"layerwatch-case-{self.key}", daemon=True
            )
            self._thread.start()
        elif self._batch is not None:
            self.sink.on_batch(self._batch)

    def _run(self) -> None:
        try:
            golden, target = self._updates
            self.session.add_update("golden", golden)
            self.session.add_update("target", target)
            for side in ("golden", "target"):
                self.session.finish(side)
            batch = dataclasses.replace(self.session.flush(), done=True)
        except Exception as exc:  # a bug or unreadable bytes: one note, never a dead grid
            self.error = str(exc) or type(exc).__name__
            batch = ResultBatch(notes=[self.error], done=True)
        self._batch = batch
        self.sink.on_batch(batch)

    def stop(self) -> None:
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.session.close()

    def wait(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
        return self._thread is not None and not self._thread.is_alive()

    def export(self, path: str) -> str:
        from layerwatch.engine.outcome import write_report

        return write_report(path, self.session)
