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
tensors are the cause) for a sub-graph compared on purpose; a side a reader found cut short (a
``dump.json`` a killed run left part-written, ``readers.base.cut_short_note``) waives the unpaired
rule too: what the cut left without a partner is said in that note, and the exit code comes
from the pairs before the cut.

Report files: the suffix names the format — ``.csv`` (msit's columns plus verdicts), ``.json``
(the ``--json`` object), ``.jsonl`` (one row per line, then one summary line), and for a
comparison's pairs ``.parquet`` (engine/report.py); anything else is refused with one line naming
these, before any work is done (:func:`check_report_path`). Files are replaced atomically
(``capture/atomic.py``); a comparison's are written as its windows of tokens are judged
(:class:`ReportStream`) and, stopped part-way, keep their rows marked incomplete.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from layerwatch.capture.atomic import replacing, temp_path
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.readers.base import CUT_SHORT
from layerwatch.engine.records import PairResult, Verdict
from layerwatch.engine.report import (
    LINE_METRICS,
    dumps_json,
    field_lines,
    json_head,
    json_lines,
    json_report,
    line_fields,
    parquet_schema,
    parquet_table,
    write_csv,
)
from layerwatch.engine.seam import Summary
from layerwatch.engine.wording import note_lines, summary_text

EXIT_OK = 0
EXIT_FINDING = 1
EXIT_UNUSABLE = 2

REPORT_SUFFIXES = (".csv", ".json", ".jsonl")
PAIR_REPORT_SUFFIXES = (*REPORT_SUFFIXES, ".parquet")
"""A comparison's pair rows may also go to Parquet (:class:`ReportStream`); the other report
objects (scan, precheck, badcase, weights, per-case) are written whole by :func:`write_object_report`."""

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
        first = (
            session.first_error
            if hasattr(session, "first_error")  # a windowed run keeps its first error
            else next((r for r in session.results() if r.verdict is Verdict.ERROR), None)
        )
        why = f": {first.reason}" if first is not None and first.reason else ""
        return f"every one of the {_n(s.pairs)} pairs could not be read{why}"
    ids = {side: session.token_ids(side).get(0) for side in ("golden", "target")}
    other_prompt = None not in ids.values() and ids["golden"] != ids["target"]
    seen = 2 * s.pairs + s.unpaired
    cut = any(CUT_SHORT in note for note in getattr(session, "notes", ()))
    mostly_unpaired = not (allow_partial or cut) and seen and s.unpaired > MOST_UNPAIRED * seen
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


def report_format(path: str | os.PathLike[str], suffixes: tuple[str, ...] = REPORT_SUFFIXES) -> str:
    """``csv``, ``json``, ``jsonl`` (or ``parquet`` where ``suffixes`` has it) from ``path``'s
    suffix; any other suffix is a user error."""
    suffix = Path(path).suffix.lower()
    if suffix not in suffixes:
        raise LayerwatchError(
            f"cannot write {path}: a report file ends in "
            f"{', '.join(suffixes[:-1])} or {suffixes[-1]}"
        )
    return suffix[1:]


def check_report_path(path: str | os.PathLike[str] | None, *, pairs: bool = False) -> None:
    """Refuse an unsupported ``-o`` before the comparison runs (it may take minutes);
    ``pairs``: a comparison's report (:class:`ReportStream`: Parquet too)."""
    if path:
        report_format(path, PAIR_REPORT_SUFFIXES if pairs else REPORT_SUFFIXES)


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


def _report_object(
    session: Any, results: Sequence[PairResult] = (), notes: Sequence[str] = ()
) -> dict[str, Any]:
    return json_report(
        results,
        session.summary,
        session.first_failure,
        session.root_cause,
        session.first_bad_token,
        getattr(session, "divergence", None),
        [*getattr(session, "notes", ()), *notes],
    )


class ReportStream:
    """The report file (``path``, format by suffix) and the ``--json`` object (``json_out``),
    written as rows come — a window of tokens at a time (engine/session/windowed.py) — so a
    headless compare never holds every row.

    The file is written to its temp name (``capture/atomic.py``) and renamed in by
    :meth:`finish`. JSON needs the summary first: its rows wait in an anonymous temp file and
    are copied after the head. Stopped part-way (:meth:`finish` with ``incomplete``), the rows
    of every whole :meth:`add` stay, marked incomplete (engine/report.py says how per format);
    an :meth:`add` that a Ctrl-C or a full disk cut short is cut back out.
    """

    def __init__(self, path: str | os.PathLike[str] | None, json_out: TextIO | None = None):
        self.path = Path(path) if path else None
        self.kind = report_format(path, PAIR_REPORT_SUFFIXES) if path else ""
        self.json_out = json_out
        self.rows = 0
        self._fh: BinaryIO | None = None
        self._tmp: Path | None = None
        self._json_rows: BinaryIO | None = None
        self._parquet: Any = None
        """The pyarrow ParquetWriter of a ``.parquet`` report (a row group per :meth:`add`)."""
        self._undo: list[tuple[BinaryIO, int]] = []
        """Where each file stood before the :meth:`add` in flight."""
        try:
            if self.path is not None:
                self._tmp = temp_path(self.path)
                self._fh = open(self._tmp, "wb")  # noqa: SIM115 (closed by finish/discard)
                if self.kind == "parquet":
                    import pyarrow.parquet as pq

                    self._parquet = pq.ParquetWriter(self._fh, parquet_schema())
                if self.kind == "csv":
                    header = io.StringIO()
                    write_csv((), header)
                    self._fh.write(header.getvalue().encode())
            if self.kind == "json" or json_out is not None:
                where = self.path.parent if self.path else None
                self._json_rows = tempfile.TemporaryFile(dir=where)  # noqa: SIM115 (discard)
        except OSError as exc:
            self.discard()
            raise self._error(exc) from None

    def add(self, results: Sequence[PairResult]) -> None:
        """Write ``results`` (in report order, after every earlier call's)."""
        parts: list[tuple[BinaryIO, bytes]] = []
        if self._fh is not None and self.kind == "csv":
            text = field_lines([line_fields(result) for result in results], self.rows)
            parts.append((self._fh, text.encode()))
        elif self._fh is not None and self.kind == "jsonl" and results:
            parts.append((self._fh, json_lines(results, b"\n") + b"\n"))
        if self._json_rows is not None and results:
            # one encode of the window's rows, joined by "," as a list's items are
            rows = json_lines(results, b",")
            parts.append((self._json_rows, (b"," if self.rows else b"") + rows))
        table = parquet_table(results) if self._parquet is not None and results else None
        self._write(parts, len(results), table)

    def _write(self, parts: list[tuple[BinaryIO, bytes]], count: int, table: Any = None) -> None:
        """Write ``parts`` (and a Parquet ``table``) as ``count`` more rows, keeping where each
        file stood until all of it is written (:attr:`_undo`)."""
        try:
            self._undo = [(fh, fh.tell()) for fh, _ in parts]
            for fh, data in parts:
                fh.write(data)
            if table is not None:
                self._parquet.write_table(table)
            self.rows, self._undo = self.rows + count, []
        except OSError as exc:
            raise self._error(exc) from None

    def add_parts(self, session: Any) -> None:
        """Every row of a live session, a token at a time (``report_parts``, core.py): a
        settled token's straight from the store's columns where only CSV lines are written
        (the same bytes as its PairResults give), else its PairResults."""
        lines_only = self._json_rows is None and self._parquet is None and self.kind != "jsonl"
        for part in session.report_parts():
            if isinstance(part, list):
                self.add(part)
            elif not lines_only:
                self.add(session.settled_results(part))
            elif self._fh is None:  # no file: the rows are counted, not read
                self.rows += len(part)
            else:
                fields = session.settled_fields(part, LINE_METRICS)
                self._write([(self._fh, field_lines(fields, self.rows).encode())], len(part))

    def finish(self, session: Any, incomplete: str = "", notes: Sequence[str] = ()) -> None:
        """The report's head (summary, findings, the session's and ``notes``) from
        ``session``; rename the file in."""
        head = _report_object(session, notes=notes)
        if incomplete:
            head = {**{k: v for k, v in head.items() if k != "rows"}, "incomplete": incomplete}
            head["rows"] = []
        try:
            for fh, at in self._undo:  # the add that was cut short: none of its rows
                fh.seek(at)
                fh.truncate()
            self._undo = []
            if self._fh is not None:
                if self.kind == "csv":
                    if incomplete:
                        self._fh.write(f"# incomplete: {incomplete}\n".encode())
                elif self.kind == "jsonl":
                    line = dumps_json({k: v for k, v in head.items() if k != "rows"}) + "\n"
                    self._fh.write(line.encode())
                elif self.kind == "parquet":
                    meta = dumps_json({k: v for k, v in head.items() if k != "rows"})
                    self._parquet.add_key_value_metadata({"layerwatch": meta})
                    self._parquet.close()
                else:
                    self._fh.write(json_head(head).encode())
                    for block in self._json_blocks():
                        self._fh.write(block)
                    self._fh.write(b"]}")
                self._fh.close()
                assert self._tmp is not None and self.path is not None
                os.replace(self._tmp, self.path)
                self._tmp = None
        except OSError as exc:
            if incomplete and self._tmp is not None and self.path is not None:
                with contextlib.suppress(OSError):  # the disk is full: keep what is written
                    assert self._fh is not None
                    self._fh.close()
                with contextlib.suppress(OSError):
                    os.replace(self._tmp, self.path)
                    self._tmp = None
            self.discard()
            raise self._error(exc) from None
        try:
            if self.json_out is not None:  # stdout's own errors (a closed pipe) stay as they are
                self.json_out.write(json_head(head))
                for block in self._json_blocks():
                    self.json_out.write(block.decode("ascii"))  # json.dumps escapes non-ASCII
                self.json_out.write("]}\n")
        finally:
            self.discard()

    def _json_blocks(self) -> Iterator[bytes]:
        assert self._json_rows is not None
        self._json_rows.seek(0)
        while block := self._json_rows.read(1 << 20):
            yield block

    def discard(self) -> None:
        """Close and remove the temp files (after :meth:`finish`, or instead of it)."""
        for fh in (self._fh, self._json_rows):
            if fh is not None:
                with contextlib.suppress(OSError):
                    fh.close()
        self._fh = self._json_rows = None
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._tmp)
            self._tmp = None

    def _error(self, exc: OSError) -> LayerwatchError:
        why = exc.strerror or str(exc)
        return LayerwatchError(f"cannot write {self.path or 'the report'}: {why}")


def write_report(
    path: str | os.PathLike[str], session: Any, results: Sequence[PairResult] | None = None
) -> str:
    """Write ``session``'s report to ``path`` in the format its suffix names; returns the path.

    ``results``: ``session.results()`` when the caller has them already (they are sorted on
    every call). A file system error becomes one line naming ``path`` (a LayerwatchError).
    """
    stream = ReportStream(path)
    if results is None and hasattr(session, "results_by_token"):  # a live session: by token
        stream.add_parts(session)
    else:
        stream.add(session.results() if results is None else results)
    stream.finish(session)
    return str(path)


def notes_to_stderr(notes: Sequence[str]) -> None:
    """The readers' notes on their input, one line each, where a command prints no summary
    (a report file only, or ``--json``): a cut-short index or a skipped file is said whatever
    the output."""
    sys.stderr.write("".join(line + "\n" for line in note_lines(notes)))


def exit_code(summary: Summary, failed_commands: Sequence[str] = ()) -> int:
    """0 clean, 1 a finding: a failed or unreadable pair, or a launched command that failed
    (CI must not pass a run whose command crashed)."""
    return EXIT_FINDING if summary.failed or summary.error or failed_commands else EXIT_OK


def conclude_compare(
    args: Any, session: Any, empty: str, stream: ReportStream | None = None
) -> int:
    """:func:`conclude` for ``layerwatch compare`` from its parsed arguments (``-o``, ``--json``,
    ``--allow-partial``): with ``-o`` stdout gets nothing but the ``--json`` object."""
    return conclude(
        session,
        sys.stdout,
        output=getattr(args, "output", None),
        as_json=bool(getattr(args, "json", False)),
        empty=empty,
        summary_with_report=False,
        allow_partial=bool(getattr(args, "allow_partial", False)),
        stream=stream,
    )


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
    stream: ReportStream | None = None,
) -> int:
    """End a finished comparison: the report file, stdout, the exit code.

    ``stream``: the rows went out already as they were compared (a windowed compare,
    engine/session/windowed.py); only the head and the end of the report are left to write.

    ``empty`` says why there was nothing to compare (then exit 2, nothing written). stdout gets
    the ``--json`` object, else the short summary and ``notes`` — unless ``summary_with_report``
    is false and a report file was written (``compare -o`` prints nothing, as it always has).
    Without the summary the notes, the session's and ``notes``, go to stderr: a cut-short index
    or a skipped file is said in one line whatever the output.
    Mismatched dumps (:func:`mismatch`) then end as a LayerwatchError: one line, exit 2.
    """
    if stream is None and hasattr(session, "results_by_token"):  # a live session: by token
        stream = ReportStream(output, out if as_json else None)
        stream.add_parts(session)
        if not stream.rows:
            stream.discard()
            raise LayerwatchError(f"nothing to compare: {empty}")
    elif stream is None:
        results = session.results()
        if not results:
            raise LayerwatchError(f"nothing to compare: {empty}")
        stream = ReportStream(output, out if as_json else None)
        stream.add(results)
    elif not stream.rows:
        stream.discard()
        raise LayerwatchError(f"nothing to compare: {empty}")
    stream.finish(session, notes=notes)  # the file, then the --json object on stdout
    if not as_json and (summary_with_report or not output):
        out.write(summary_text(session) + "\n")
        out.write("".join(line + "\n" for line in note_lines(notes)))  # capped, as the session's
    elif not summary_with_report:  # `compare` without its summary (the live front ends
        notes_to_stderr([*session.notes, *notes])  # said each note as it came)
    out.flush()
    wrong = mismatch(session, allow_partial=allow_partial)
    if wrong is not None:  # after the report: it shows what was (not) paired
        raise LayerwatchError(wrong)
    return exit_code(session.summary, failed_commands)
