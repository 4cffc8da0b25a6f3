"""``layerwatch compare`` on two msit ``logitscmp`` folders: the first bad token of each case.

Each ``*_{key}_{token}.pth`` golden file is paired with the target file of the same key and
token and compared as logits by the same code as a dump's logits pairs
(``engine/numerics/compare.py``, float64: KL via log-softmax, top-1 agreement, top-k overlap,
the golden top-2 margin) against ``engine/thresholds.toml``'s logits limits. A flipped argmax
passes when the golden run was not confident (its top-2 margin is within the limit): the row
then says "near-tie". Per case the first failing token is the case's first bad token.

JSON: ``{"summary", "first_failure", "rows", "cases": [{"key", "verdict", "first_bad_token",
"first_failure"}]}``; exit 0 no bad token, 1 some, 2 unusable input.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.floattext import finite
from layerwatch.engine.numerics.compare import compare_pairs
from layerwatch.engine.numerics.thresholds import Thresholds
from layerwatch.engine.outcome import EXIT_FINDING, EXIT_OK, check_report_path, write_object_report
from layerwatch.engine.readers.load import canonical_dtype
from layerwatch.engine.readers.logitsdir import LogitsFile, detect, locate, logits_files
from layerwatch.engine.records import MARGIN, TOP1, PairResult, TensorKey, TensorRecord, Verdict

NODE = "logits"
"""The node name logits pairs get (thresholds overrides may match it)."""


@dataclass
class LogitsRow:
    """One token of one case."""

    key: str
    token: int
    verdict: Verdict
    reason: str = ""
    metrics: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "token": self.token,
            "node": NODE,
            "verdict": self.verdict.value,
            "metrics": finite(self.metrics),
            "reason": self.reason,
        }


@dataclass
class LogitsCase:
    """All tokens of one case; its verdict is its worst row's."""

    key: str
    rows: list[LogitsRow]

    @property
    def first_bad(self) -> LogitsRow | None:
        return next((r for r in self.rows if r.verdict in (Verdict.FAIL, Verdict.ERROR)), None)

    @property
    def verdict(self) -> Verdict:
        bad = self.first_bad
        if bad is not None:
            return bad.verdict
        if any(r.verdict is Verdict.UNPAIRED for r in self.rows):
            return Verdict.UNPAIRED
        return Verdict.PASS

    def to_json(self) -> dict[str, Any]:
        bad = self.first_bad
        return {
            "key": self.key,
            "verdict": self.verdict.value,
            "first_bad_token": None if bad is None else bad.token,
            "first_failure": None if bad is None else _failure(bad),
        }


def _failure(row: LogitsRow) -> dict[str, Any]:
    return {"key": row.key, "token": row.token, "node": NODE, "reason": row.reason}


def is_logits_pair(golden: str, target: str) -> bool:
    """Both paths are logits folders (msit's ``logitscmp`` input), not tensor dumps."""
    return detect(golden) and detect(target)


def compare_folders(
    golden: str | Path, target: str | Path, thresholds: Thresholds | None = None
) -> list[LogitsCase]:
    """Every case of the two folders, tokens in order; unpaired files are rows of their own."""
    thresholds = thresholds or Thresholds.default()
    g = {(f.key, f.token): f for f in logits_files(golden)}
    t = {(f.key, f.token): f for f in logits_files(target)}
    rows: dict[tuple[str, int], LogitsRow] = {}
    items: list[tuple[TensorRecord, TensorRecord, bool]] = []
    where: list[tuple[str, int]] = []
    for ident in sorted(g.keys() | t.keys(), key=lambda k: (_order(k[0]), k[1])):
        if ident not in g or ident not in t:
            side = "golden" if ident in g else "target"
            rows[ident] = LogitsRow(*ident, Verdict.UNPAIRED, f"only in the {side} folder")
            continue
        try:
            pair = (_record(g[ident]), _record(t[ident]))
        except LayerwatchError as exc:
            rows[ident] = LogitsRow(*ident, Verdict.ERROR, str(exc))
            continue
        if pair[0].shape != pair[1].shape:
            rows[ident] = LogitsRow(
                *ident, Verdict.ERROR, f"vocabulary {pair[0].shape[0]} vs {pair[1].shape[0]}"
            )
            continue
        items.append((*pair, True))
        where.append(ident)
    for ident, result in zip(where, compare_pairs(items, thresholds), strict=True):
        rows[ident] = _row(ident, result)
    cases: dict[str, list[LogitsRow]] = {}
    for ident in sorted(rows, key=lambda k: (_order(k[0]), k[1])):
        cases.setdefault(ident[0], []).append(rows[ident])
    return [LogitsCase(key, case_rows) for key, case_rows in cases.items()]


def _order(key: str) -> tuple[int, int | str]:
    return (0, int(key)) if key.isdigit() else (1, key)


def _record(file: LogitsFile) -> TensorRecord:
    loc = locate(file)
    vocab = max(loc.shape)
    strides = None
    if loc.strides is not None:
        strides = (max(s for d, s in zip(loc.shape, loc.strides, strict=True) if d == vocab),)
    flat = dataclasses.replace(loc, shape=(vocab,), strides=strides)
    return TensorRecord(
        key=TensorKey(file.token, NODE, "output"),
        dtype=canonical_dtype(loc.dtype),
        shape=(vocab,),
        loc=flat,
        source=str(file.path),
    )


def _row(ident: tuple[str, int], result: PairResult) -> LogitsRow:
    reason = result.reason
    m = result.metrics
    if result.verdict is Verdict.PASS and m.get(TOP1, 1.0) < 1.0:
        reason = f"argmax flipped within a near-tie (golden top-2 margin {m.get(MARGIN, 0.0):.3g})"
    return LogitsRow(*ident, result.verdict, reason, dict(m))


def report_object(cases: Sequence[LogitsCase]) -> dict[str, Any]:
    rows = [r for case in cases for r in case.rows]
    counts = {v.value: sum(1 for r in rows if r.verdict is v) for v in Verdict}
    bad = [case for case in cases if case.first_bad is not None]
    first = min(
        (case.first_bad for case in bad if case.first_bad is not None),
        key=lambda r: (r.token, _order(r.key)),
        default=None,
    )
    return {
        "summary": {"cases": len(cases), "bad_cases": len(bad), "pairs": len(rows), **counts},
        "first_failure": None if first is None else _failure(first),
        "rows": [r.to_json() for r in rows],
        "cases": [case.to_json() for case in cases],
    }


def summary_lines(cases: Sequence[LogitsCase]) -> list[str]:
    obj = report_object(cases)
    s = obj["summary"]
    lines = [
        f"logits: {s['cases']} cases · {s['bad_cases']} with a bad token · {s['pairs']} tokens"
    ]
    for case in cases:
        bad = case.first_bad
        if bad is not None:
            lines.append(f"case {case.key}: first bad token {bad.token} · {bad.reason}")
    return lines


def compare_logits_main(args: Any) -> int:
    """``layerwatch compare`` when both paths are logits folders."""
    output = getattr(args, "output", None)
    if output:
        check_report_path(output)
    cases = compare_folders(
        args.golden, args.target, Thresholds.load(getattr(args, "thresholds", None))
    )
    if not cases:
        raise LayerwatchError(f"nothing to compare: no logits files in {args.golden}")
    obj = report_object(cases)
    if output:
        _write(Path(output), obj)
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(obj, indent=1) + "\n")
    elif not output:
        print("\n".join(summary_lines(cases)))
    return EXIT_FINDING if obj["summary"]["bad_cases"] else EXIT_OK


def _write(path: Path, obj: dict[str, Any]) -> None:
    def rows(out: TextIO) -> None:
        names = sorted({name for row in obj["rows"] for name in row["metrics"]})
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["key", "token", "verdict", *names, "reason"])
        for row in obj["rows"]:
            writer.writerow(
                [row["key"], row["token"], row["verdict"]]
                + [row["metrics"].get(n, "") for n in names]
                + [row["reason"]]
            )

    write_object_report(path, obj, rows)
