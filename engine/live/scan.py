"""``layerwatch dump --scan [--exit-on-anomaly] -- CMD``: the scan while the dump is written.

The command runs under capture as with ``layerwatch dump`` (capture/dumpcmd.py); every
:data:`POLL_S` seconds its dump's index is tailed (engine/readers/layerwatch.py: only whole
lines, each pointing at bytes already on disk) and the new calls are judged by the same
:class:`~layerwatch.engine.scan.Scanner` as ``layerwatch scan``. The first anomaly is printed
the moment it is judged; ``--exit-on-anomaly`` then stops the command (SIGINT, so a Python
child closes its dump; msit errcheck's ``--exit``). At the end the scan's summary is printed
(and ``-o`` written) as ``layerwatch scan`` would for the finished dump.

Exit code: 1 when an anomaly was found, else the command's own code.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from layerwatch.engine.scan import Scanner, ScanRow
from layerwatch.engine.scan_report import bounds_from, row_line, summary_lines, write_report

POLL_S = 0.2
"""Seconds between two reads of the growing index (the writer flushes every 50 ms)."""


class LiveScan:
    """Tails a layerwatch dump directory being written and scans what lands."""

    def __init__(self, out: Path, scanner: Scanner, exit_on_anomaly: bool = False) -> None:
        from layerwatch.engine.readers.layerwatch import LayerwatchReader

        self.out = out
        self.reader = LayerwatchReader(out)
        self.scanner = scanner
        self.exit_on_anomaly = exit_on_anomaly
        self.first: ScanRow | None = None
        self.notes: list[str] = []
        self._next = 0.0

    def poll(self, final: bool = False) -> list[ScanRow]:
        if not self.out.is_dir():
            return []
        update = self.reader.poll(None, final=final)
        if update.topology is not None:
            self.scanner.topology = update.topology
        self.notes.extend(update.notes)
        rows = self.scanner.add(update.tensors)
        if final:
            rows += self.scanner.finish()
        return rows

    def tick(self) -> bool:
        """Called by the supervisor while the command runs; true = stop it now."""
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + POLL_S
        rows = self.poll()
        if rows and self.first is None:
            self.first = rows[0]
            print(f"layerwatch dump: anomaly: {row_line(rows[0])}", file=sys.stderr, flush=True)
            return self.exit_on_anomaly
        return False


def dump_scan_main(args: argparse.Namespace) -> int:
    """``layerwatch dump --scan``/``--exit-on-anomaly`` (tui/cli.py routes here)."""
    from layerwatch.capture.dumpcmd import run_dump
    from layerwatch.capture.errors import LayerwatchError
    from layerwatch.engine.outcome import EXIT_FINDING, check_report_path

    if getattr(args, "format", "layerwatch") != "layerwatch" or args.dumper != "layerwatch":
        raise LayerwatchError("--scan reads layerwatch dumps: drop --format msit/--dumper msit")
    output = getattr(args, "scan_output", None)
    check_report_path(output)
    scanner = Scanner(bounds=bounds_from(args))
    live: list[LiveScan] = []

    def make_tick(out: Path) -> Callable[[], bool]:
        live.append(LiveScan(out, scanner, bool(args.exit_on_anomaly)))
        return live[0].tick

    code = run_dump(args, tick=make_tick)
    if not live:
        return code
    scan = live[0]
    scan.poll(final=True)
    report = scanner.report
    report.notes.extend(scan.notes)
    if output:
        write_report(report, output)
    for line in summary_lines(report):
        print(f"layerwatch scan: {line}", flush=True)
    return EXIT_FINDING if report.rows else code
