"""How a comparison ends, for every front end: the report file, what stdout says, the exit code.

``layerwatch compare`` (engine/runner.py), the headless ``open``/``run``/``watch``/``demo``
(tui/frontends.py) and the TUI's export (``LivePipeline.export``) all end here, so the same
dumps give the same report and the same exit code whichever way they were compared.

Exit codes: 0 every pair passes, 1 a finding (a FAIL or an ERROR pair; for launched commands
also a command that failed), 2 unusable or mismatched input (bad usage, unreadable dumps, nothing
to compare, or dumps that do not describe the same run — :func:`mismatch`: a
:class:`LayerwatchError` the CLI prints as one line, after the report file is written).

Mismatched input (:func:`mismatch`), so that a comparison of unrelated or damaged dumps is never
read as a clean pass: every pair unreadable; the prompt ids differ at token 0; more than
``MOST_UNPAIRED`` (half) of all tensors seen found no partner; no pair passed or failed at all.
``--allow-partial`` waives the unpaired rule (and "none passed or failed" when only unpaired
tensors are the cause) for a sub-graph compared on purpose.

Report files: the suffix names the format — ``.csv`` (msit's columns plus verdicts), ``.json``
(the ``--json`` object), ``.jsonl`` (one row per line, then one summary line); anything else is
refused with one line naming these, before any work is done (:func:`check_report_path`).
Files are replaced atomically (``capture/atomic.py``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from layerwatch.capture.atomic import replacing
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.records import PairResult, Verdict
from layerwatch.engine.report import dumps_json, json_report, write_csv, write_jsonl
from layerwatch.engine.seam import Summary
from layerwatch.engine.wording import summary_text

EXIT_OK = 0
EXIT_FINDING = 1
EXIT_UNUSABLE = 2

REPORT_SUFFIXES = (".csv", ".json", ".jsonl")

MOST_UNPAIRED = 0.5
"""Share of all tensors seen (both sides) without a partner above which the dumps are taken to
describe different runs: a port of the same model pairs nearly everything by name or ``--map``."""


def _n(value: int) -> str:
    """``1 200``: thousands apart with a space, as the reports print counts."""
    return f"{value:,}".replace(",", " ")


def _prompt(ids: tuple[int, ...] | None) -> str:
    return "none dumped" if ids is None else f"{_n(len(ids))} ids"


def _few(ids: tuple[int, ...] | None) -> str:
    if not ids:
        return "[]"
    head = ", ".join(map(str, ids[:6]))
    return f"[{head}{', …' if len(ids) > 6 else ''}]"


def mismatch(session: Any, *, allow_partial: bool = False) -> str | None:
    """Why the golden and target dumps cannot be judged against each other, or None.

    One line for the exit-2 message; the rules are the module docstring's.
    """
    s = session.summary
    if s.pairs and s.error == s.pairs:
        first = next((r for r in session.results() if r.verdict is Verdict.ERROR), None)
        why = f": {first.reason}" if first is not None and first.reason else ""
        return f"every one of the {_n(s.pairs)} pairs could not be read{why}"
    ids = {side: session.token_ids(side).get(0) for side in ("golden", "target")}
    other_prompt = None not in ids.values() and ids["golden"] != ids["target"]
    seen = 2 * s.pairs + s.unpaired
    mostly_unpaired = not allow_partial and seen and s.unpaired > MOST_UNPAIRED * seen
    if mostly_unpaired:
        what = "model and prompt" if other_prompt else "model"
        return (
            f"the dumps do not look like the same {what}: {_n(s.unpaired)} of {_n(seen)} "
            f"tensors unpaired; golden prompt {_prompt(ids['golden'])}, target "
            f"{_prompt(ids['target'])} (--allow-partial compares a sub-graph on purpose)"
        )
    if other_prompt:
        return (
            f"the dumps were not fed the same prompt: at token 0 golden "
            f"{_prompt(ids['golden'])} {_few(ids['golden'])}, target {_prompt(ids['target'])} "
            f"{_few(ids['target'])}"
        )
    if s.passed + s.failed == 0 and (s.pairs or not allow_partial):
        return (
            f"no pair passed or failed ({_n(s.pairs)} paired: {_n(s.diverged)} diverged, "
            f"{_n(s.error)} unreadable; {_n(s.unpaired)} tensors unpaired): nothing was compared"
        )
    return None


def report_format(path: str | os.PathLike[str]) -> str:
    """``csv``, ``json`` or ``jsonl`` from ``path``'s suffix; any other suffix is a user error."""
    suffix = Path(path).suffix.lower()
    if suffix not in REPORT_SUFFIXES:
        raise LayerwatchError(
            f"cannot write {path}: a report file ends in "
            f"{', '.join(REPORT_SUFFIXES[:-1])} or {REPORT_SUFFIXES[-1]}"
        )
    return suffix[1:]


def check_report_path(path: str | os.PathLike[str] | None) -> None:
    """Refuse an unsupported ``-o`` before the comparison runs (it may take minutes)."""
    if path:
        report_format(path)


def write_object_report(
    path: str | os.PathLike[str], obj: dict[str, Any], write_csv_rows: Callable[[TextIO], None]
) -> None:
    """A headless command's report object (``summary``, ``first_failure``, ``rows``...) to
    ``path`` in the format its suffix names: CSV by ``write_csv_rows``, the object as JSON, or
    JSONL (one row a line, then one line with everything but the rows), replaced atomically.
    The ``-o`` rule of badcase, scan, precheck-free commands and per-case reports alike."""
    kind = report_format(path)
    try:
        with replacing(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as fh:
            if kind == "csv":
                write_csv_rows(fh)
            elif kind == "json":
                fh.write(json.dumps(obj, indent=1) + "\n")
            else:
                for row in obj["rows"]:
                    fh.write(json.dumps(row) + "\n")
                fh.write(json.dumps({k: v for k, v in obj.items() if k != "rows"}) + "\n")
    except OSError as exc:
        raise LayerwatchError(f"{path}: cannot write the report: {exc.strerror}") from None


def _report_object(session: Any, results: Sequence[PairResult]) -> dict[str, Any]:
    return json_report(
        results,
        session.summary,
        session.first_failure,
        session.root_cause,
        session.first_bad_token,
        getattr(session, "divergence", None),
    )


def write_report(
    path: str | os.PathLike[str], session: Any, results: Sequence[PairResult] | None = None
) -> str:
    """Write ``session``'s report to ``path`` in the format its suffix names; returns the path.

    ``results``: ``session.results()`` when the caller has them already (they are sorted on
    every call). A file system error becomes one line naming ``path`` (a LayerwatchError).
    """
    kind = report_format(path)
    rows = session.results() if results is None else results
    try:
        with replacing(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as fh:
            if kind == "csv":
                write_csv(rows, fh)
            elif kind == "json":
                fh.write(dumps_json(_report_object(session, rows)))
            else:
                write_jsonl(_report_object(session, rows), fh)
    except OSError as exc:
        raise LayerwatchError(f"cannot write {path}: {exc.strerror or exc}") from None
    return str(path)


def exit_code(summary: Summary, failed_commands: Sequence[str] = ()) -> int:
    """0 clean, 1 a finding: a failed or unreadable pair, or a launched command that failed
    (CI must not pass a run whose command crashed)."""
    return EXIT_FINDING if summary.failed or summary.error or failed_commands else EXIT_OK


def conclude(
    session: Any,
    out: TextIO,
    *,
    output: str | None,
    as_json: bool,
    empty: str,
    summary_with_report: bool,
    notes: Sequence[str] = (),
    failed_commands: Sequence[str] = (),
    allow_partial: bool = False,
) -> int:
    """End a finished comparison: the report file, stdout, the exit code.

    ``empty`` says why there was nothing to compare (then exit 2, nothing written). stdout gets
    the ``--json`` object, else the short summary and ``notes`` — unless ``summary_with_report``
    is false and a report file was written (``compare -o`` prints nothing, as it always has).
    Mismatched dumps (:func:`mismatch`) then end as a LayerwatchError: one line, exit 2.
    """
    results = session.results()
    if not results:
        raise LayerwatchError(f"nothing to compare: {empty}")
    if output:
        write_report(output, session, results)
    if as_json:
        out.write(dumps_json(_report_object(session, results)) + "\n")
    elif summary_with_report or not output:
        out.write(summary_text(session) + "\n")
        for note in notes:
            out.write(f"note: {note}\n")
    out.flush()
    wrong = mismatch(session, allow_partial=allow_partial)
    if wrong is not None:  # after the report: it shows what was (not) paired
        raise LayerwatchError(wrong)
    return exit_code(session.summary, failed_commands)
