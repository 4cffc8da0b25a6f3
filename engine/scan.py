"""``layerwatch scan DUMP``: anomalies of one run, no golden needed (msit errcheck's question).

Every output tensor of every (token, node) is judged by ``numerics/anomaly.py`` from its
statistics (the index's ``stats`` for layerwatch dumps, so no payload is read; other formats'
tensors are reduced to statistics once). An anomalous output is then placed:

* ``propagated`` — one of the node's inputs already carries an anomaly that explains it;
* ``inside`` — a node nested in this one (same token) shows an anomaly that appears there
  (nodes finish inner first, so the inner one is judged first);
* ``appears`` — neither: the anomaly is born here.

``first_failure`` is the first ``appears`` row in execution order (token, then completion
order); when every anomalous row is explained by an input (the fault is outside any hooked
module, e.g. a mask built in plain code), it is the first anomalous row. Without dumped inputs
(``--part out``) nothing counts as propagated and the first row in order is the answer.

Rows list anomalous tensors only (a clean 4k-token run would otherwise print millions of rows);
``summary`` counts what was scanned. Exit codes as engine/outcome.py: 0 clean, 1 an anomaly,
2 unusable input (a missing dump, a truncated file: one line).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from layerwatch.capture.atomic import write_text
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.numerics import anomaly
from layerwatch.engine.outcome import EXIT_FINDING, EXIT_OK, check_report_path, report_format
from layerwatch.engine.records import Stats, TensorKey, TensorRecord, Topology

APPEARS = "appears"
INSIDE = "inside"
PROPAGATED = "propagated"


@dataclass(frozen=True, slots=True)
class ScanRow:
    """One anomalous output tensor."""

    key: TensorKey
    kinds: tuple[str, ...]
    status: str
    dtype: str
    shape: tuple[int, ...]
    stats: Stats
    order: int
    ratio: float | None = None
    """Output magnitude over the largest input magnitude (``None``: no floating input)."""
    source: str = ""

    @property
    def anomaly(self) -> str:
        return self.kinds[0]

    def reason(self) -> str:
        s = self.stats
        bits = []
        if s.nan:
            bits.append(f"{s.nan} NaN")
        if s.inf:
            bits.append(f"{s.inf} Inf")
        bits.append(f"max {s.max:.6g}, min {s.min:.6g}")
        if self.ratio is not None:
            bits.append(f"{self.ratio:.3g}× its inputs' magnitude")
        how = {
            APPEARS: "appears here (inputs clean)",
            INSIDE: "appears in a nested node",
            PROPAGATED: "carried in by an input",
        }
        return f"{'+'.join(self.kinds)} {how[self.status]}: {', '.join(bits)}"

    def to_json(self, with_rank: bool = False) -> dict[str, Any]:
        row: dict[str, Any] = {"token": self.key.token, "node": self.key.node}
        if with_rank:
            row["rank"] = self.key.rank
        row.update(
            tensor=self.key.stem,
            anomaly=self.anomaly,
            kinds=list(self.kinds),
            status=self.status,
            order=self.order,
            dtype=self.dtype,
            shape=list(self.shape),
            stats={
                "max": self.stats.max,
                "min": self.stats.min,
                "mean": self.stats.mean,
                "norm": self.stats.norm,
                "nan": self.stats.nan,
                "inf": self.stats.inf,
            },
            ratio=self.ratio,
            reason=self.reason(),
        )
        return row


@dataclass(slots=True)
class ScanReport:
    rows: list[ScanRow] = field(default_factory=list)
    tensors: int = 0
    """Output tensors judged."""
    nodes: int = 0
    """(token, node) calls seen."""
    tokens: int = 0
    ranks: int = 1
    loaded: int = 0
    """Payloads read because the dump carried no statistics for them."""
    bounds: anomaly.Bounds = field(default_factory=anomaly.Bounds)
    peak_ratio: tuple[float, TensorKey] | None = None
    """The largest output/input magnitude ratio seen (clean or not): the jump rule's headroom."""
    peak_magnitude: tuple[float, TensorKey] | None = None
    """The largest finite output magnitude seen."""
    notes: list[str] = field(default_factory=list)

    @property
    def first_failure(self) -> ScanRow | None:
        born = [r for r in self.rows if r.status == APPEARS]
        return (born or self.rows or [None])[0]

    def to_json(self) -> dict[str, Any]:
        multi = self.ranks > 1
        first = self.first_failure
        by_kind = {k: sum(1 for r in self.rows if k in r.kinds) for k in anomaly.KINDS}
        return {
            "summary": {
                "tensors": self.tensors,
                "nodes": self.nodes,
                "tokens": self.tokens,
                "ranks": self.ranks,
                "anomalous": len(self.rows),
                "appears": sum(1 for r in self.rows if r.status == APPEARS),
                "by_kind": by_kind,
                "payloads_read": self.loaded,
                "peak_ratio": _peak(self.peak_ratio),
                "peak_magnitude": _peak(self.peak_magnitude),
                "jump_ratio": self.bounds.ratio,
                "jump_floor": self.bounds.floor,
                "notes": list(self.notes),
            },
            "first_failure": None if first is None else first.to_json(with_rank=multi),
            "rows": [r.to_json(with_rank=multi) for r in self.rows],
        }


def _peak(peak: tuple[float, TensorKey] | None) -> dict[str, Any] | None:
    if peak is None:
        return None
    value, key = peak
    return {"value": value, "token": key.token, "node": key.node, "tensor": key.stem}


def _is_mask(stem: str) -> bool:
    return "mask" in stem.lower()


class _StatsSource:
    """Statistics of a record: the dump's own when present, else one streamed read."""

    def __init__(self) -> None:
        self.loaded = 0

    def __call__(self, rec: TensorRecord) -> Stats | None:
        if rec.stats is not None:
            return rec.stats
        if rec.loc is None:
            return None
        from layerwatch.engine.numerics.statistics import tensor_stats

        try:
            stats = tensor_stats(rec.loc)
        except (OSError, ValueError) as exc:
            where = rec.source or rec.loc.path
            raise LayerwatchError(f"{where}: cannot read {rec.key.label()} ({exc})") from None
        self.loaded += 1
        return stats


def _node_order(records: list[TensorRecord], topology: Topology | None) -> int:
    for rec in records:
        if rec.order >= 0:
            return rec.order
    if topology is not None:
        node = topology.nodes.get(records[0].key.node.split("#")[0])
        if node is not None and node.order >= 0:
            return node.order
    return 1 << 30


def scan_records(
    records: Iterable[TensorRecord],
    topology: Topology | None = None,
    bounds: anomaly.Bounds = anomaly.DEFAULT_BOUNDS,
) -> ScanReport:
    """Judge every output in ``records`` (one run, any number of ranks and tokens)."""
    groups: dict[tuple[int, int, str], list[TensorRecord]] = defaultdict(list)
    for rec in records:
        groups[(rec.key.rank, rec.key.token, rec.key.node)].append(rec)
    report = ScanReport(bounds=bounds)
    get_stats = _StatsSource()
    ordered = sorted(
        groups.items(), key=lambda kv: (kv[0][1], kv[0][0], _node_order(kv[1], topology), kv[0][2])
    )
    report.nodes = len(ordered)
    report.tokens = len({t for _, t, _ in groups})
    report.ranks = max(1, len({r for r, _, _ in groups}))
    born: dict[tuple[int, int], list[str]] = defaultdict(list)
    """Nodes at (rank, token) where an anomaly appeared or sits inside: their parents are
    ``inside``."""
    for (rank, token, node), recs in ordered:
        order = _node_order(recs, topology)
        in_stats: list[Stats] = []
        in_kinds: set[str] = set()
        has_inputs = False
        outputs: list[tuple[TensorRecord, Stats]] = []
        for rec in sorted(recs, key=lambda r: r.key.stem):
            if rec.key.part == "input":
                has_inputs = True
                if not anomaly.is_float(rec.dtype):
                    continue
                stats = get_stats(rec)
                if stats is None:
                    continue
                kinds = set(anomaly.own_kinds(stats, rec.dtype))
                if _is_mask(rec.key.stem):
                    kinds.discard(anomaly.SATURATED)  # finfo.min is what masks hold
                else:
                    in_stats.append(stats)
                in_kinds |= kinds
            else:
                stats = get_stats(rec)
                if stats is not None:
                    outputs.append((rec, stats))
        nested = [n for n in born[(rank, token)] if n.startswith(node.split("#")[0] + ".")]
        for rec, stats in outputs:
            report.tensors += 1
            ratio = anomaly.ratio(stats, in_stats) if anomaly.is_float(rec.dtype) else None
            if ratio is not None and (report.peak_ratio is None or ratio > report.peak_ratio[0]):
                report.peak_ratio = (ratio, rec.key)
            mag = anomaly.magnitude(stats) if anomaly.is_float(rec.dtype) else 0.0
            if report.peak_magnitude is None or mag > report.peak_magnitude[0]:
                report.peak_magnitude = (mag, rec.key)
            kinds = anomaly.output_kinds(stats, rec.dtype, in_stats, bounds)
            if not kinds:
                continue
            if has_inputs and anomaly.carries(kinds, in_kinds):
                status = PROPAGATED
            elif nested:
                status = INSIDE
            else:
                status = APPEARS
            if status != PROPAGATED and node not in born[(rank, token)]:
                born[(rank, token)].append(node)
            report.rows.append(
                ScanRow(
                    rec.key,
                    tuple(kinds),
                    status,
                    rec.dtype,
                    tuple(rec.shape),
                    stats,
                    order,
                    ratio,
                    rec.source,
                )
            )
    report.loaded = get_stats.loaded
    return report


def scan_dump(path: str, bounds: anomaly.Bounds = anomaly.DEFAULT_BOUNDS) -> ScanReport:
    """Read a finished dump at ``path`` and scan it; unusable input raises LayerwatchError."""
    from layerwatch.engine.readers import open_dump

    if not Path(path).exists():
        raise LayerwatchError(f"{path}: no such file or directory")
    update = open_dump(path).poll(None, final=True)
    broken = [n for n in update.notes if "truncated or corrupt" in n]
    if broken:
        raise LayerwatchError(broken[0])
    if not update.tensors:
        raise LayerwatchError(f"nothing to scan: no tensors in {path}")
    report = scan_records(update.tensors, update.topology, bounds)
    report.notes.extend(update.notes)
    if report.tensors == 0:
        raise LayerwatchError(f"nothing to scan: no output tensors in {path}")
    return report


def summary_lines(report: ScanReport) -> list[str]:
    """What a person reads: counts, the first anomaly and where it came from."""
    first = report.first_failure
    head = (
        f"scanned {report.tensors} outputs of {report.nodes} node calls over {report.tokens} tokens"
    )
    notes = [f"note: {n}" for n in report.notes]
    if first is None:
        return [f"{head}: no anomaly (NaN, Inf, saturation, all-zero, jump)", *notes]
    lines = [
        f"{head}: {len(report.rows)} anomalous, "
        f"{sum(1 for r in report.rows if r.status == APPEARS)} where one appears"
    ]
    rank = f" · rank {first.key.rank}" if report.ranks > 1 else ""
    lines.append(
        f"first anomaly: token {first.key.token}{rank} · {first.key.node} · "
        f"{first.key.stem}: {first.reason()}"
    )
    return lines + notes


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


def report_text(report: ScanReport, kind: str) -> str:
    """The report as ``csv``, ``json`` or ``jsonl`` (rows, then one summary line)."""
    obj = report.to_json()
    if kind == "json":
        return json.dumps(obj, indent=1) + "\n"
    if kind == "jsonl":
        lines = [json.dumps(row) for row in obj["rows"]]
        lines.append(json.dumps({"summary": obj["summary"], "first_failure": obj["first_failure"]}))
        return "\n".join(lines) + "\n"
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
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
    return buf.getvalue()


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


def scan_main(args: argparse.Namespace) -> int:
    check_report_path(args.output)
    report = scan_dump(args.dump, bounds_from(args))
    if args.output:
        try:
            write_text(args.output, report_text(report, report_format(args.output)))
        except OSError as exc:
            raise LayerwatchError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    if args.json:
        sys.stdout.write(json.dumps(report.to_json(), indent=1) + "\n")
    elif not args.output:
        print("\n".join(summary_lines(report)))
    sys.stdout.flush()
    return EXIT_FINDING if report.rows else EXIT_OK
