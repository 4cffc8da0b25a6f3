"""``layerwatch badcase GOLDEN TARGET``: which questions the target gets wrong, and from which token.

The first step of the seeds' workflow (msit ``bcanalyze``): two evaluation result files of the
same dataset, one per side, merged on ``key`` (and ``queries`` when both files have it). A *bad*
case passed on the golden side and failed on the target; an *improved* one the reverse. For
each, ``first_diff_token`` is the first output-token index where the two runs' token ids differ
(the step to capture and compare next), ``None`` when the ids are equal or were not recorded.

Exit codes: 0 no bad case, 1 some, 2 unusable input.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.outcome import (
    EXIT_FINDING,
    EXIT_OK,
    check_report_path,
    notes_to_stderr,
    write_object_report,
)
from layerwatch.engine.readers.evalcases import EvalCase, EvalRun, read_eval

BAD = "bad"
IMPROVED = "improved"
SAME = "same"


@dataclass(frozen=True, slots=True)
class CasePair:
    """One question present in both evaluation files."""

    golden: EvalCase
    target: EvalCase

    @property
    def kind(self) -> str:
        if self.golden.passed and not self.target.passed:
            return BAD
        if self.target.passed and not self.golden.passed:
            return IMPROVED
        return SAME

    @property
    def first_diff_token(self) -> int | None:
        return first_difference(self.golden.output_ids, self.target.output_ids)

    def to_json(self) -> dict[str, Any]:
        g, t = self.golden, self.target
        row: dict[str, Any] = {"key": g.key}
        if g.queries is not None:
            row["queries"] = g.queries
        row.update(
            kind=self.kind,
            passed_golden=g.passed,
            passed_target=t.passed,
            first_diff_token=self.first_diff_token,
            output_tokens_golden=None if g.output_ids is None else len(g.output_ids),
            output_tokens_target=None if t.output_ids is None else len(t.output_ids),
            same_input=None
            if g.input_ids is None or t.input_ids is None
            else g.input_ids == t.input_ids,
        )
        return row


@dataclass(frozen=True, slots=True)
class BadCaseReport:
    pairs: tuple[CasePair, ...]
    golden_only: tuple[str, ...]
    target_only: tuple[str, ...]
    with_queries: bool
    skipped: int
    notes: tuple[str, ...] = ()
    """What the readers noticed about the files (a last line cut short and left out)."""

    @property
    def bad(self) -> list[CasePair]:
        return [p for p in self.pairs if p.kind == BAD]

    @property
    def improved(self) -> list[CasePair]:
        return [p for p in self.pairs if p.kind == IMPROVED]

    def to_json(self) -> dict[str, Any]:
        bad = self.bad
        first = bad[0].to_json() if bad else None
        return {
            "summary": {
                "cases": len(self.pairs),
                "bad": len(bad),
                "improved": len(self.improved),
                "golden_only": len(self.golden_only),
                "target_only": len(self.target_only),
                "skipped_rows": self.skipped,
            },
            "first_failure": first,
            "bad_cases": [p.to_json() for p in bad],
            "improved": [p.to_json() for p in self.improved],
            "rows": [p.to_json() for p in self.pairs],
        }


def first_difference(a: Sequence[int] | None, b: Sequence[int] | None) -> int | None:
    """First index where two id sequences differ; the shorter length if one is a prefix."""
    if a is None or b is None:
        return None
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def analyze(golden: EvalRun, target: EvalRun) -> BadCaseReport:
    """Merge two evaluation runs on key (+ queries when both have it), in golden file order."""
    with_queries = golden.has_queries and target.has_queries

    def ident(c: EvalCase) -> tuple[str, str | None]:
        return (c.key, c.queries if with_queries else None)

    by_id: dict[tuple[str, str | None], EvalCase] = {}
    for case in target.cases:
        if ident(case) in by_id:  # same key, queries differ, and golden has no queries column
            raise LayerwatchError(f"{target.path}:{case.line}: duplicate key {case.key!r}")
        by_id[ident(case)] = case
    pairs: list[CasePair] = []
    golden_only: list[str] = []
    for case in golden.cases:
        other = by_id.pop(ident(case), None)
        if other is None:
            golden_only.append(case.key)
        else:
            pairs.append(CasePair(case, other))
    if not pairs:
        raise LayerwatchError(
            f"no case is in both files ({len(golden.cases)} golden, {len(target.cases)} target"
            + (", merged on key and queries" if with_queries else ", merged on key")
            + "): are they the same dataset?"
        )
    return BadCaseReport(
        tuple(pairs),
        tuple(golden_only),
        tuple(c.key for c in by_id.values()),
        with_queries,
        golden.skipped + target.skipped,
        golden.notes + target.notes,
    )


CSV_COLUMNS = (
    "key",
    "queries",
    "input_token_ids_golden",
    "input_token_ids_test",
    "output_token_ids_golden",
    "output_token_ids_test",
    "passed_golden",
    "passed_test",
    "first_diff_token",
    "kind",
)
"""msit bcanalyze's columns (``queries`` only when both files have it), then ours."""


def write_csv(report: BadCaseReport, out: io.TextIOBase | Any) -> None:
    """The cases whose pass/fail differ, as msit writes them, plus ``first_diff_token``."""
    columns = [c for c in CSV_COLUMNS if c != "queries" or report.with_queries]
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)

    def ids(v: tuple[int, ...] | None) -> str:
        return "" if v is None else json.dumps(list(v))

    for pair in report.pairs:
        if pair.kind == SAME:
            continue
        g, t = pair.golden, pair.target
        cells = {
            "key": g.key,
            "queries": g.queries or "",
            "input_token_ids_golden": ids(g.input_ids),
            "input_token_ids_test": ids(t.input_ids),
            "output_token_ids_golden": ids(g.output_ids),
            "output_token_ids_test": ids(t.output_ids),
            "passed_golden": g.passed,
            "passed_test": t.passed,
            "first_diff_token": "" if pair.first_diff_token is None else pair.first_diff_token,
            "kind": pair.kind,
        }
        writer.writerow([cells[c] for c in columns])


def summary_lines(report: BadCaseReport) -> list[str]:
    """What a person reads: the counts, each bad case with its first differing token, next step."""
    bad, improved = report.bad, report.improved
    lines = [
        f"cases: {len(report.pairs)} in both · {len(bad)} bad (golden passed, target failed)"
        f" · {len(improved)} improved"
    ]
    for pair in bad:
        k = pair.first_diff_token
        where = "outputs identical or not recorded" if k is None else f"first differing token {k}"
        lines.append(f"bad case {pair.golden.key}: {where}")
    if report.golden_only or report.target_only:
        lines.append(
            f"note: {len(report.golden_only)} cases only in golden, "
            f"{len(report.target_only)} only in target (not compared)"
        )
    if report.skipped:
        lines.append(f"note: {report.skipped} rows without key or pass value skipped")
    lines.extend(f"note: {note}" for note in report.notes)
    if bad:
        pair = bad[0]
        k = pair.first_diff_token
        upto = "" if k is None else f" and compare tokens 0-{k} (--tokens 0-{k})"
        lines.append(f"next: capture case {pair.golden.key} on both sides{upto}")
    return lines


def badcase_main(args: argparse.Namespace) -> int:
    check_report_path(args.output)
    report = analyze(read_eval(args.golden), read_eval(args.target))
    if args.output:
        _write_report(report, Path(args.output))
    if args.json:
        json.dump(report.to_json(), sys.stdout, indent=1)
        sys.stdout.write("\n")
        notes_to_stderr(report.notes)
    else:
        print("\n".join(summary_lines(report)))
    return EXIT_FINDING if report.bad else EXIT_OK


def _write_report(report: BadCaseReport, path: Path) -> None:
    """The report in the format ``path``'s suffix names (the rule of every command's ``-o``)."""
    write_object_report(path, report.to_json(), lambda out: write_csv(report, out))
