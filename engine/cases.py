"""Per-case comparison: a dump with several cases (prompts) is compared case by case.

A layerwatch dump marks cases in its index (``capture/cases.py``): each is a span of tokens.
Each case's tensors are renumbered from token 0 and compared in a session of their own, so one
case's divergence never reaches the next and every case gets its own first bad token. Golden
and target cases are paired by key when their keys overlap, else by order.

JSON: the usual ``summary`` (totals, plus ``cases``/``bad_cases``), ``first_failure`` (of the
first failing case, with its ``case``), ``rows`` (each with its ``case``), and ``cases``:
``[{"key", "verdict", "first_bad_token", "first_failure"}]``.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from layerwatch.capture.atomic import replacing
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.outcome import EXIT_FINDING, EXIT_OK, report_format
from layerwatch.engine.readers.base import ReaderUpdate
from layerwatch.engine.records import TensorKey
from layerwatch.engine.report import CSV_COLUMNS, csv_row, json_report, json_row

CASE, CASE_END = "case", "case_end"


@dataclass(frozen=True)
class CaseSpan:
    """Tokens ``begin`` .. ``end - 1`` of a dump (``end`` ``None``: to the end)."""

    key: str
    begin: int
    end: int | None


def spans(marks: Sequence[tuple[str, str, int]]) -> list[CaseSpan]:
    """The cases of one dump from its case lines; a duplicate key is a one-line error."""
    starts = sorted((token, key) for kind, key, token in marks if kind == CASE)
    ends = {key: token for kind, key, token in marks if kind == CASE_END}
    keys = [key for _, key in starts]
    dup = next((k for k in keys if keys.count(k) > 1), None)
    if dup is not None:
        raise LayerwatchError(f"case key {dup!r} appears twice in one dump: keys must be unique")
    out = []
    for i, (begin, key) in enumerate(starts):
        nxt = starts[i + 1][0] if i + 1 < len(starts) else None
        end = ends.get(key)
        if end is None or (nxt is not None and end > nxt):
            end = nxt
        out.append(CaseSpan(key, begin, end))
    return out


def has_cases(*updates: ReaderUpdate) -> bool:
    """More than one case on some side: compare case by case."""
    return any(sum(1 for kind, _, _ in u.case_marks if kind == CASE) > 1 for u in updates)


def dumps_have_cases(golden: str, target: str) -> bool:
    """Whether either finished dump marks cases: ``open`` then reports case by case, as compare."""
    from layerwatch.engine.readers import open_dump

    for path, side in ((golden, "golden"), (target, "target")):
        reader = open_dump(path, side=side)
        lines = getattr(reader, "has_case_lines", None)
        if lines is not None and not lines():
            continue  # found by the index's bytes: no case line, no need to hold every record
        if has_cases(reader.poll(None, final=True)):
            return True
    return False


def slice_update(update: ReaderUpdate, span: CaseSpan) -> ReaderUpdate:
    """The part of ``update`` inside ``span``, tokens renumbered from 0."""

    def inside(token: int) -> bool:
        return token >= span.begin and (span.end is None or token < span.end)

    tensors = [
        dataclasses.replace(
            rec,
            key=TensorKey(rec.key.token - span.begin, rec.key.node, rec.key.stem, rec.key.rank),
        )
        for rec in update.tensors
        if inside(rec.key.token)
    ]
    ids = {t - span.begin: v for t, v in update.token_ids.items() if inside(t)}
    return ReaderUpdate(
        tensors=tensors,
        topology=update.topology,
        token_ids=ids,
        complete=update.complete,
        weights=dict(update.weights),
    )


Slicer = Callable[[str, CaseSpan], ReaderUpdate]
"""(side, case) → that case's update, tokens renumbered from 0 (:func:`slice_update`'s result)."""


def pair_cases(
    golden: list[CaseSpan], target: list[CaseSpan]
) -> list[tuple[str, CaseSpan | None, CaseSpan | None]]:
    """(key, golden, target) by key when the keys overlap, else by order."""
    g = {c.key: c for c in golden}
    t = {c.key: c for c in target}
    if g.keys() & t.keys():
        keys = [c.key for c in golden] + [c.key for c in target if c.key not in g]
        return [(k, g.get(k), t.get(k)) for k in keys]
    out: list[tuple[str, CaseSpan | None, CaseSpan | None]] = []
    for i in range(max(len(golden), len(target))):
        gc = golden[i] if i < len(golden) else None
        tc = target[i] if i < len(target) else None
        out.append(((gc or tc).key, gc, tc))  # type: ignore[union-attr]
    return out


@dataclass
class CaseResult:
    key: str
    verdict: str
    report: dict[str, Any] = field(default_factory=dict)
    results: list[Any] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        ff = self.report.get("first_failure")
        return {
            "key": self.key,
            "verdict": self.verdict,
            "first_bad_token": self.report.get("first_bad_token"),
            "first_failure": ff,
        }


def compare_cases(
    updates: dict[str, ReaderUpdate], make_session: Callable[[], Any]
) -> list[CaseResult]:
    """One session per paired case (``make_session`` builds each with the command's options);
    each case keeps its results (the TUI's cases list opens them)."""
    whole = {side: spans(u.case_marks) or [CaseSpan("0", 0, None)] for side, u in updates.items()}
    out = []
    slicer: Slicer = lambda side, span: slice_update(updates[side], span)  # noqa: E731
    for key, gc, tc in pair_cases(whole["golden"], whole["target"]):
        if gc is None or tc is None:
            out.append(CaseResult(key, "unpaired"))
        else:
            out.append(_compare_case(key, gc, tc, slicer, make_session))
    return out


def report_object(cases: Sequence[CaseResult]) -> dict[str, Any]:
    """The per-case JSON object but its rows (:func:`stream_cases` writes them in place)."""
    totals: dict[str, int] = {}
    for case in cases:
        for name, value in case.report.get("summary", {}).items():
            totals[name] = totals.get(name, 0) + value
    bad = [c for c in cases if c.verdict == "fail"]
    first = bad[0].report if bad else {}

    def tagged(finding: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if finding is None else {"case": bad[0].key, **finding}

    return {
        "summary": {**totals, "cases": len(cases), "bad_cases": len(bad)},
        "first_failure": tagged(first.get("first_failure")),
        "root_cause": tagged(first.get("root_cause")),
        "first_bad_token": first.get("first_bad_token"),
        "rows": [],
        "cases": [c.to_json() for c in cases],
    }


def summary_lines(cases: Sequence[CaseResult]) -> list[str]:
    obj = report_object(cases)
    s = obj["summary"]
    lines = [f"cases: {s['cases']} · {s['bad_cases']} failing · {s.get('pairs', 0)} pairs"]
    for case in cases:
        ff = case.report.get("first_failure")
        where = ""
        if ff:
            where = f" · first bad token {case.report.get('first_bad_token')} · {ff.get('node')}"
        lines.append(f"case {case.key}: {case.verdict}{where}")
    return lines


def stream_cases(
    updates: dict[str, ReaderUpdate],
    make_session: Callable[[], Any],
    out: TextIO,
    *,
    output: str | None,
    as_json: bool,
    slicer: Slicer | None = None,
) -> int:
    """Report file, stdout and exit code of a per-case comparison (0 clean, 1 a failing case),
    each case's rows written as the case is judged and then dropped: a headless compare of many
    cases holds one case's results at a time, not every row of every case (``-o``'s CSV/JSONL
    rows go straight to the file; JSON's, which follow the totals, wait in a temporary file).
    ``slicer``: reads a case's records when its turn comes (``updates`` then hold only the case
    lines, token ids, topology and weights: engine/runner.py ``_case_tables``)."""
    kind = report_format(output) if output else ""
    slicer = slicer or (lambda side, span: slice_update(updates[side], span))
    try:
        return _stream_cases(
            updates, make_session, out, output=output, kind=kind, as_json=as_json, slicer=slicer
        )
    except OSError as exc:
        raise LayerwatchError(f"{output}: cannot write the report: {exc.strerror}") from None


def _stream_cases(
    updates: dict[str, ReaderUpdate],
    make_session: Callable[[], Any],
    out: TextIO,
    *,
    output: str | None,
    kind: str,
    as_json: bool,
    slicer: Slicer,
) -> int:
    whole = {side: spans(u.case_marks) or [CaseSpan("0", 0, None)] for side, u in updates.items()}
    cases: list[CaseResult] = []
    rows = 0
    with contextlib.ExitStack() as stack:
        fh = None
        if output:
            tmp = stack.enter_context(replacing(output))
            fh = stack.enter_context(open(tmp, "w", encoding="utf-8", newline=""))
        writer = csv.writer(fh, lineterminator="\n") if fh is not None and kind == "csv" else None
        if writer is not None:
            writer.writerow(["case", *CSV_COLUMNS])
        held = None  # the JSON object's rows, each indented as json.dumps(obj, indent=1) would
        if as_json or kind == "json":
            held = stack.enter_context(tempfile.TemporaryFile("w+", encoding="utf-8"))
        for key, gc, tc in pair_cases(whole["golden"], whole["target"]):
            if gc is None or tc is None:
                cases.append(CaseResult(key, "unpaired"))
                continue
            case = _compare_case(key, gc, tc, slicer, make_session)
            for result in case.results:
                row = {"case": key, **json_row(result)}
                if writer is not None:
                    writer.writerow([key, *csv_row(result, rows)])
                elif fh is not None and kind == "jsonl":
                    fh.write(json.dumps(row) + "\n")
                if held is not None:
                    text = json.dumps(row, indent=1).replace("\n", "\n  ")
                    held.write(("" if not rows else ",\n") + "  " + text)
                rows += 1
            case.results = [None] * len(case.results)  # only whether it had any is kept
            cases.append(case)
        if not rows:
            raise LayerwatchError("nothing to compare: no case has tensors on both sides")
        obj = report_object(cases)
        text = _with_rows(json.dumps({**obj, "rows": [_ROWS]}, indent=1), held)
        if fh is not None:
            if kind == "json":
                fh.write(text + "\n")
            elif kind == "jsonl":
                fh.write(json.dumps({k: v for k, v in obj.items() if k != "rows"}) + "\n")
    if as_json:
        out.write(text + "\n")
    elif not output:
        out.write("\n".join(summary_lines(cases)) + "\n")
    out.flush()
    return EXIT_FINDING if obj["summary"]["bad_cases"] else EXIT_OK


_ROWS = "\x00rows\x00"


def _with_rows(head: str, held: TextIO | None) -> str:
    """The JSON object ``head`` (its rows a placeholder) with the held rows in their place."""
    if held is None:
        return head
    mark = "  " + json.dumps(_ROWS)
    before, after = head.split(mark)
    held.seek(0)
    return before + held.read() + after


def _compare_case(
    key: str,
    gc: CaseSpan,
    tc: CaseSpan,
    slicer: Slicer,
    make_session: Callable[[], Any],
) -> CaseResult:
    """One paired case in a session of its own: its verdict, report head and results."""
    session = make_session()
    try:
        session.add_update("golden", slicer("golden", gc))
        session.add_update("target", slicer("target", tc))
        for side in ("golden", "target"):
            session.finish(side)
        session.flush()
        results = session.results()
        report = json_report(
            (), session.summary, session.first_failure, session.root_cause, session.first_bad_token
        )
    finally:
        session.close()
    s = session.summary
    verdict = "fail" if s.failed or s.error else "diverged" if s.diverged else "pass"
    if not results:
        verdict = "empty"
    return CaseResult(key, verdict, report, results)
