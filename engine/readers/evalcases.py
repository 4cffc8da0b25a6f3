"""Evaluation result files, as msit ``bcanalyze`` reads them: one row per dataset question.

A file is CSV (``.csv``), JSON Lines (``.jsonl``) or a JSON array of objects (``.json``) with
the columns ``key`` and ``passed`` (msit's alias ``pass`` is accepted), optionally ``queries``,
``input_token_ids`` and ``output_token_ids`` (list literals such as ``[1, 2, 3]``). Pass values
are spelled True/False, true/false, 1/0, yes/no or Correct/Wrong, any case. Rows whose key or
pass value is empty are skipped and counted, as msit drops rows with a missing value; anything
else malformed is a one-line :class:`LayerwatchError` naming the file and the line — except the
last line of a CSV or JSONL file that ends without a newline (an evaluation killed while it
wrote that line): when it does not read as a whole row it is left out with a note
(:attr:`EvalRun.notes`), and every row before it is kept. A JSON array cut short (no closing
``]``) keeps its complete objects the same way, with one note that says where it ends.
"""

from __future__ import annotations

import ast
import csv
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.readers.base import cut_short_note

REQUIRED = ("key", "passed")
OPTIONAL = ("queries", "input_token_ids", "output_token_ids")
_ALIASES = {"pass": "passed"}
_TRUE = {"true", "1", "correct", "yes", "pass", "passed"}
_FALSE = {"false", "0", "wrong", "no", "fail", "failed"}
_INK = re.compile(r"[^ \t\n\r]")
"""Anything but JSON's whitespace."""


@dataclass(frozen=True, slots=True)
class EvalCase:
    """One question of an evaluation run and how the model did on it."""

    key: str
    passed: bool
    queries: str | None = None
    input_ids: tuple[int, ...] | None = None
    output_ids: tuple[int, ...] | None = None
    line: int = 0
    """Line (CSV/JSONL) or item (JSON) number in its file, for messages."""


@dataclass(frozen=True, slots=True)
class EvalRun:
    """The cases of one evaluation file, in file order."""

    path: Path
    cases: tuple[EvalCase, ...]
    columns: tuple[str, ...]
    """The columns the file has (after the ``pass`` → ``passed`` rename)."""
    skipped: int
    """Rows dropped for an empty key or pass value."""
    notes: tuple[str, ...] = ()
    """What was noticed about the file: its last line cut short and left out."""

    @property
    def has_queries(self) -> bool:
        return "queries" in self.columns


def read_eval(path: str | Path) -> EvalRun:
    """Parse one evaluation file; every problem is one line naming the file and the row."""
    p = Path(path)
    if not p.is_file():
        raise LayerwatchError(f"{p}: no such evaluation file")
    rows, torn, unterminated, cut = _raw_rows(p)
    columns = _columns(p, rows)
    cases: list[EvalCase] = []
    skipped = 0
    seen: dict[tuple[str, str | None], int] = {}
    notes = [] if torn is None else [_torn_note(p, torn)]
    if cut is not None:
        notes.append(cut)
    open_end = torn is None and bool(rows) and unterminated
    for line, row in rows:
        key = _text(row.get("key"))
        passed = _text(row.get("passed"))
        last = open_end and line == rows[-1][0]  # may be cut short: not whole is not an error
        if not key or not passed:
            if last:
                notes.append(_torn_note(p, line))
            else:
                skipped += 1
            continue
        try:
            case = EvalCase(
                key=key,
                passed=_flag(p, line, passed),
                queries=_text(row.get("queries")) if "queries" in columns else None,
                input_ids=_ids(p, line, "input_token_ids", row.get("input_token_ids")),
                output_ids=_ids(p, line, "output_token_ids", row.get("output_token_ids")),
                line=line,
            )
        except LayerwatchError:
            if not last:
                raise
            notes.append(_torn_note(p, line))
            continue
        ident = (case.key, case.queries)
        if ident in seen:
            raise LayerwatchError(
                f"{p}:{line}: duplicate key {case.key!r} (first on line {seen[ident]})"
            )
        seen[ident] = line
        cases.append(case)
    return EvalRun(p, tuple(cases), columns, skipped, tuple(notes))


def _torn_note(p: Path, line: int) -> str:
    return f"{p}:{line}: last line cut short (no newline at the end), skipped"


def _raw_rows(p: Path) -> tuple[list[tuple[int, dict[str, Any]]], int | None, bool, str | None]:
    """The rows; the number of a JSONL last line cut short (left out), else None; whether
    a file of lines (CSV, JSONL) ends without a line end: its last line may be cut short (a
    JSON array is whole or says where it was cut); the note of a JSON array cut short."""
    try:
        text = p.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise LayerwatchError(f"{p}: cannot read: {exc}") from None
    suffix = p.suffix.lower()
    unterminated = bool(text) and not text.endswith(("\n", "\r"))
    if suffix == ".csv":
        return _csv_rows(p, text), None, unterminated, None
    if suffix in (".jsonl", ".ndjson"):
        rows, torn = _jsonl_rows(p, text, unterminated)
        return rows, torn, unterminated, None
    if suffix == ".json":
        rows, cut = _json_rows(p, text)
        return rows, None, False, cut
    raise LayerwatchError(f"{p}: unknown evaluation file type (supported: .csv, .jsonl, .json)")


def _csv_rows(p: Path, text: str) -> list[tuple[int, dict[str, Any]]]:
    reader = csv.DictReader(text.splitlines())
    try:
        out = []
        for row in reader:
            if None in row:  # more cells than header columns
                raise LayerwatchError(
                    f"{p}:{reader.line_num}: more cells than the header has columns"
                )
            out.append((reader.line_num, _renamed(row)))
    except csv.Error as exc:
        raise LayerwatchError(f"{p}:{reader.line_num}: malformed CSV: {exc}") from None
    if reader.fieldnames is None:
        raise LayerwatchError(f"{p}: empty CSV file (no header line)")
    return out


def _jsonl_rows(
    p: Path, text: str, torn: bool
) -> tuple[list[tuple[int, dict[str, Any]]], int | None]:
    """The rows, and the number of a last line that does not parse when ``torn`` (the text
    ends without a line end): left out, not an error."""
    out: list[tuple[int, dict[str, Any]]] = []
    lines = text.splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            if torn and n == len(lines):
                return out, n
            raise LayerwatchError(f"{p}:{n}: not a JSON object: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise LayerwatchError(f"{p}:{n}: not a JSON object")
        out.append((n, _renamed(obj)))
    return out, None


def _json_rows(p: Path, text: str) -> tuple[list[tuple[int, dict[str, Any]]], str | None]:
    """The rows, and the note of an array cut short (its complete objects kept)."""
    cut = None
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        prefix = _array_prefix(text)
        if prefix is None:
            raise LayerwatchError(f"{p}: not JSON: {exc.msg} (line {exc.lineno})") from None
        items, at = prefix
        cut = cut_short_note(p, at, f"{len(items)} complete cases", "the file")
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise LayerwatchError(f"{p}: expected a JSON array of objects, one per case")
    return [(n, _renamed(obj)) for n, obj in enumerate(items, 1)], cut


def _array_prefix(text: str) -> tuple[list[Any], int] | None:
    """A JSON array that ends before its closing ``]`` (a run killed while it wrote the file):
    (the values before the first one that does not parse, where the text ends). None: not an
    array, or one that is closed but corrupt."""
    body = text.rstrip()
    at = _skip_space(text, 0)
    if not body.startswith("[", at) or body.endswith("]"):
        return None
    decode = json.JSONDecoder().raw_decode
    items: list[Any] = []
    at += 1
    while True:
        try:
            value, end = decode(text, _skip_space(text, at))
        except json.JSONDecodeError:
            return items, len(text)
        items.append(value)
        at = _skip_space(text, end)
        if at >= len(text):
            return items, len(text)
        if text[at] != ",":
            return None
        at += 1


def _skip_space(text: str, at: int) -> int:
    """Where the first character at or after ``at`` that is not JSON whitespace is."""
    found = _INK.search(text, at)
    return len(text) if found is None else found.start()


def _renamed(row: dict[str, Any]) -> dict[str, Any]:
    return {_ALIASES.get(str(k).strip(), str(k).strip()): v for k, v in row.items()}


def _columns(p: Path, rows: list[tuple[int, dict[str, Any]]]) -> tuple[str, ...]:
    found: dict[str, None] = {}
    for _, row in rows:
        found.update(dict.fromkeys(row))
    missing = [c for c in REQUIRED if c not in found]
    if missing:
        have = ", ".join(found) or "none"
        raise LayerwatchError(
            f"{p}: missing column {' and '.join(missing)} (found: {have}; "
            f"needs key and passed or pass)"
        )
    return tuple(found)


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value != value:  # NaN from a JSON writer
        return ""
    return str(value).strip()


def _flag(p: Path, line: int, value: str) -> bool:
    low = value.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise LayerwatchError(
        f"{p}:{line}: pass value {value!r} is not True/False, 1/0 or Correct/Wrong"
    )


def _ids(p: Path, line: int, column: str, value: Any) -> tuple[int, ...] | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    parsed = value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            try:
                parsed = ast.literal_eval(value.strip())
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                parsed = None
    if isinstance(parsed, list | tuple) and len(parsed) == 1 and isinstance(parsed[0], list):
        parsed = parsed[0]  # [[1, 2, 3]]: one batch row, as tokenizers return it
    if not isinstance(parsed, list | tuple) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in parsed
    ):
        shown = value if len(str(value)) <= 40 else str(value)[:37] + "..."
        raise LayerwatchError(f"{p}:{line}: {column} {shown!r} is not a list of token ids")
    return tuple(parsed)
