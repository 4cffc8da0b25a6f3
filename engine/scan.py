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

import functools
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path

from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.numerics import anomaly
from layerwatch.engine.records import Locator, Stats, TensorRecord, Topology
from layerwatch.engine.scan_rows import APPEARS, INSIDE, PROPAGATED, ScanReport, ScanRow

__all__ = [
    "APPEARS",
    "INSIDE",
    "PROPAGATED",
    "ScanReport",
    "ScanRow",
    "Scanner",
    "scan_dump",
    "scan_records",
]


def _is_mask(stem: str) -> bool:
    return "mask" in stem.lower()


def _infs_all_negative(loc: Locator) -> bool:
    """Every Inf of the payload at ``loc`` is −inf (False where it cannot be read)."""
    import numpy as np
    from layerwatch.engine.readers.load import load_array

    try:
        values = load_array(loc)
    except (OSError, ValueError, LayerwatchError):
        return False
    return not bool(np.isposinf(values).any())


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


class Scanner:
    """Judges (token, node) calls as their records come in, in execution order.

    ``add`` buffers records per (rank, token) and judges the calls that are surely whole: a
    writer appends index lines in completion order, so once a call with order *k* is seen,
    every call before it at that token has landed; a later token closes the earlier ones.
    ``finish`` judges the rest. Offline, ``add(everything)`` then ``finish()``.
    """

    def __init__(
        self, topology: Topology | None = None, bounds: anomaly.Bounds = anomaly.DEFAULT_BOUNDS
    ) -> None:
        self.topology = topology
        self.report = ScanReport(bounds=bounds)
        self._stats = _StatsSource()
        self._negative_infs = functools.lru_cache(maxsize=256)(_infs_all_negative)
        """:func:`_infs_all_negative`, remembered for the last few payloads: a node's output
        is read once though the next node judges it again as its input."""
        self._pending: dict[tuple[int, int], dict[str, list[TensorRecord]]] = {}
        self._latest: dict[int, int] = {}
        """Latest token seen per rank."""
        self._born: dict[tuple[int, int], list[str]] = defaultdict(list)
        """Nodes at (rank, token) where an anomaly appeared or sits inside (their parents are
        ``inside``)."""
        self._first_bad: dict[int, int] = {}
        """The first anomalous token per rank."""
        self._tokens: set[int] = set()
        self._ranks: set[int] = set()
        self.on_call: Callable[[str, list[TensorRecord], list[ScanRow]], None] | None = None
        """Told every judged call (node, its records, its anomalous rows; clean calls too):
        the live scan grid (engine/live/scan_session.py) colours clean cells from it."""

    def _masked_inf(self, rec: TensorRecord, stats: Stats) -> bool:
        """Every Inf of ``rec`` is −inf and it has no NaN: attention scores with a causal mask
        built by ``masked_fill(-inf)`` (as ``finfo.min`` is for transformers), not an overflow.
        The statistics count Infs without their sign, so the payload is read, for these tensors
        only; without one (a statistics-only dump) the Inf is judged."""
        if not stats.inf or stats.nan or rec.loc is None:
            return False
        return self._negative_infs(rec.loc)

    def add(self, records: Iterable[TensorRecord]) -> list[ScanRow]:
        """Buffer ``records``; judge the calls now known whole; returns the new rows."""
        for rec in records:
            k = rec.key
            self._pending.setdefault((k.rank, k.token), {}).setdefault(k.node, []).append(rec)
            self._latest[k.rank] = max(self._latest.get(k.rank, k.token), k.token)
        return self._judge(final=False)

    def finish(self) -> list[ScanRow]:
        """Judge everything still buffered (the dump is complete)."""
        return self._judge(final=True)

    def _judge(self, final: bool) -> list[ScanRow]:
        new: list[ScanRow] = []
        for rank, token in sorted(self._pending, key=lambda rt: (rt[1], rt[0])):
            calls = self._pending[(rank, token)]
            ordered = sorted(calls.items(), key=lambda kv: (self._order(kv[1]), kv[0]))
            if not final and token >= self._latest[rank]:
                ordered = ordered[:-1]  # the last call may still be landing
            for node, recs in ordered:
                del calls[node]
                rows = self._call(rank, token, node, recs)
                new.extend(rows)
                if self.on_call is not None:
                    self.on_call(node, recs, rows)
            if not calls:
                del self._pending[(rank, token)]
        report = self.report
        report.rows.extend(new)
        report.loaded = self._stats.loaded
        report.tokens = len(self._tokens)
        report.ranks = max(1, len(self._ranks))
        return new

    def _order(self, records: list[TensorRecord]) -> int:
        for rec in records:
            if rec.order >= 0:
                return rec.order
        if self.topology is not None:
            node = self.topology.nodes.get(records[0].key.node.split("#")[0])
            if node is not None and node.order >= 0:
                return node.order
        return 1 << 30

    def _call(self, rank: int, token: int, node: str, recs: list[TensorRecord]) -> list[ScanRow]:
        """Judge the outputs of one (token, node) call against its inputs."""
        report, get_stats = self.report, self._stats
        report.nodes += 1
        self._tokens.add(token)
        self._ranks.add(rank)
        order = self._order(recs)
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
                own = set(anomaly.own_kinds(stats, rec.dtype))
                if anomaly.INF in own and self._masked_inf(rec, stats):
                    own.discard(anomaly.INF)
                if _is_mask(rec.key.stem):
                    own.discard(anomaly.SATURATED)  # finfo.min is what masks hold
                else:
                    in_stats.append(stats)
                in_kinds |= own
            elif anomaly.is_float(rec.dtype):  # integer/bool/complex outputs are not judged
                stats = get_stats(rec)
                if stats is not None:
                    outputs.append((rec, stats))
            else:
                report.tensors += 1
        born = self._born[(rank, token)]
        earlier = self._first_bad.get(rank)
        earlier = earlier if earlier is not None and earlier < token else None
        prefix = node.split("#")[0] + "."
        nested = any(n.startswith(prefix) for n in born)
        rows = []
        for rec, stats in outputs:
            report.tensors += 1
            floating = anomaly.is_float(rec.dtype)
            ratio = anomaly.ratio(stats, in_stats) if floating else None
            if ratio is not None and (report.peak_ratio is None or ratio > report.peak_ratio[0]):
                report.peak_ratio = (ratio, rec.key)
            mag = anomaly.magnitude(stats) if floating else 0.0
            if report.peak_magnitude is None or mag > report.peak_magnitude[0]:
                report.peak_magnitude = (mag, rec.key)
            kinds = anomaly.output_kinds(stats, rec.dtype, in_stats, report.bounds)
            if anomaly.INF in kinds and self._masked_inf(rec, stats):
                kinds.remove(anomaly.INF)
            if not kinds:
                continue
            if has_inputs and anomaly.carries(kinds, in_kinds):
                status = PROPAGATED
            elif nested:
                status = INSIDE
            else:
                status = APPEARS
            if status != PROPAGATED and node not in born:
                born.append(node)
            rows.append(
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
                    earlier,
                )
            )
        if rows:
            self._first_bad.setdefault(rank, token)
        return rows


def scan_records(
    records: Iterable[TensorRecord],
    topology: Topology | None = None,
    bounds: anomaly.Bounds = anomaly.DEFAULT_BOUNDS,
) -> ScanReport:
    """Judge every output in ``records`` (one finished run, any number of ranks and tokens)."""
    scanner = Scanner(topology, bounds)
    scanner.add(records)
    scanner.finish()
    return scanner.report


def scan_dump(path: str, bounds: anomaly.Bounds = anomaly.DEFAULT_BOUNDS) -> ScanReport:
    """Read a finished dump at ``path`` and scan it; unusable input raises LayerwatchError."""
    from layerwatch.engine.readers import open_dump

    if not Path(path).exists():
        raise LayerwatchError(f"{path}: no such file or directory")
    update = open_dump(path).poll(None, final=True)
    # A payload cut short or corrupt is the reader's note; every other tensor is scanned.
    if not update.tensors:
        raise LayerwatchError(f"nothing to scan: no tensors in {path}")
    report = scan_records(update.tensors, update.topology, bounds)
    report.notes.extend(update.notes)
    if report.tensors == 0:
        raise LayerwatchError(f"nothing to scan: no output tensors in {path}")
    return report
