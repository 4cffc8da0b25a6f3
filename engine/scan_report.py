"""What ``layerwatch scan`` prints and writes: the summary lines, the report files, the CLI.

The scan itself is engine/scan.py; exit codes and the ``-o`` suffix rule are
engine/outcome.py's (0 clean, 1 an anomaly, 2 unusable input).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from typing import TextIO

from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.numerics import anomaly
from layerwatch.engine.outcome import (
    EXIT_FINDING,
    EXIT_OK,
    check_report_path,
    notes_to_stderr,
    write_object_report,
)
from layerwatch.engine.scan import APPEARS, ScanReport, ScanRow, scan_dump
from layerwatch.engine.wording import note_lines


def summary_lines(report: ScanReport) -> list[str]:
    """What a person reads: counts, the first anomaly and where it came from."""
    first = report.first_failure
    head = (
        f"scanned {report.tensors} outputs of {report.nodes} node calls over {report.tokens} tokens"
    )
    notes = note_lines(report.notes)
    if first is None:
        return [f"{head}: no anomaly (NaN, Inf, saturation, all-zero, jump)", *notes]
    lines = [
        f"{head}: {len(report.rows)} anomalous, "
        f"{sum(1 for r in report.rows if r.status == APPEARS)} where one appears"
    ]
    lines.append(f"first anomaly: {row_line(first, report.ranks > 1)}")
    return lines + notes


def row_line(row: ScanRow, with_rank: bool = False) -> str:
    """``token 0 · root.model.layers.1.mlp.act_fn · output: nan appears here …``"""
    rank = f" · rank {row.key.rank}" if with_rank else ""
    return f"token {row.key.token}{rank} · {row.key.node} · {row.key.stem}: {row.reason()}"


CSV_COLUMNS = (
    "token",
    "rank",
    "node",
    "tensor",
    "order",
    "anomaly",
    "kinds",
    "status",
    "dtype",
    "shape",
    "max",
    "min",
    "mean",
    "norm",
    "nan",
    "inf",
    "ratio",
    "reason",
)


def write_csv(report: ScanReport, out: TextIO) -> None:
    """The anomalous tensors as CSV rows (``CSV_COLUMNS``)."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in report.rows:
        s = r.stats
        writer.writerow(
            [
                r.key.token,
                r.key.rank,
                r.key.node,
                r.key.stem,
                r.order,
                r.anomaly,
                "+".join(r.kinds),
                r.status,
                r.dtype,
                json.dumps(list(r.shape)),
                s.max,
                s.min,
                s.mean,
                s.norm,
                s.nan,
                s.inf,
                "" if r.ratio is None else r.ratio,
                r.reason(),
            ]
        )


def bounds_from(args: argparse.Namespace) -> anomaly.Bounds:
    ratio = getattr(args, "jump_ratio", None)
    floor = getattr(args, "jump_floor", None)
    bounds = anomaly.Bounds(
        anomaly.JUMP_RATIO if ratio is None else ratio,
        anomaly.JUMP_FLOOR if floor is None else floor,
    )
    if not bounds.ratio > 0 or not bounds.floor >= 0:
        raise LayerwatchError("--jump-ratio must be > 0 and --jump-floor >= 0")
    return bounds


def write_report(report: ScanReport, path: str) -> None:
    """The report in the format ``path``'s suffix names, replaced atomically."""
    write_object_report(path, report.to_json(), lambda out: write_csv(report, out))


def scan_main(args: argparse.Namespace) -> int:
    check_report_path(args.output)
    report = scan_dump(args.dump, bounds_from(args))
    if args.output:
        write_report(report, args.output)
    if args.json:
        sys.stdout.write(json.dumps(report.to_json(), indent=1) + "\n")
    elif not args.output:
        print("\n".join(summary_lines(report)))
    else:
        notes_to_stderr(report.notes)
    sys.stdout.flush()
    return EXIT_FINDING if report.rows else EXIT_OK
