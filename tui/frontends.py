"""``layerwatch run``, ``watch`` and ``open``: build a live pipeline, show it in the TUI or headless.

Headless (``--headless``, or when stdout is not a terminal): progress lines on stderr at most
once a second, run-state changes and notes on stderr as they happen, the first failure on
stdout the moment it is known (stderr with ``--json``, so stdout stays one JSON object), then
the same summary, report files and exit codes as ``layerwatch compare`` (engine/outcome.py
decides both for every front end): 0 everything passed, 1 a failure, 2 nothing to compare, bad
input or the engine worker gave up (its one line), 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from layerwatch.capture.errors import LayerwatchError

EXIT_INTERRUPTED = 130
PROGRESS_EVERY = 1.0


def _session(args: argparse.Namespace, tokens: str | None = None) -> Any:
    from layerwatch.capture.tokens import parse_tokens
    from layerwatch.engine.precheck import precheck_sentence
    from layerwatch.engine.session.budget import live_spill
    from layerwatch.engine.session.core import CompareSession

    session = CompareSession(
        thresholds=getattr(args, "thresholds", None),
        mapping=getattr(args, "map", None),
        tokens=parse_tokens(tokens) if tokens else None,
        jobs=getattr(args, "jobs", 0) or 0,
        auto_map=True if getattr(args, "auto_map", False) else None,
        side_stats=bool(getattr(args, "output", None)),  # msit's max/min/mean CSV columns
        compact=True,  # settled tokens kept as store rows (engine/session/settled.py)
        spill=live_spill(getattr(args, "output", None)),  # full chunks to an unnamed file
    )
    session.operator_check = precheck_sentence  # the operator view adds the op's own precheck
    return session


def _launch_dir(out: Path, side: str) -> Path:
    path = out / side
    if path.exists() and any(path.iterdir()):
        raise LayerwatchError(
            f"{path} is not empty (an earlier run?): pick another --out or remove it"
        )
    return path


def run_main(args: argparse.Namespace) -> int:
    from layerwatch.capture.launch import CaptureOptions, LaunchSpec
    from layerwatch.engine.live.pipeline import LivePipeline, SideSpec, attach_spec

    options = CaptureOptions.from_args(args)
    out = Path(args.out or time.strftime("layerwatch-run-%Y%m%d-%H%M%S")).absolute()

    def side(name: str, cmd: str | None, path: str | None) -> SideSpec:
        if cmd is None:
            check_attachable(path or "")
            return attach_spec(path or "", idle_s=args.idle)
        argv: str | list[str] = cmd if args.shell else shlex.split(cmd)
        where = _launch_dir(out, name)
        dumper = getattr(args, f"{name}_dumper", "layerwatch") or "layerwatch"
        launch = LaunchSpec(argv, where, options, dumper, shell=args.shell, log=out / f"{name}.log")
        return SideSpec(where, launch)

    target = side("target", args.target_cmd, args.target)
    if args.golden_cmd is None and args.golden is None:  # no golden: the anomaly scan, live
        title = f"layerwatch run · scan · {_name(args.target_cmd or args.target)}"
        return present(scan_pipeline(target, args), args, title)
    golden = side("golden", args.golden_cmd, args.golden)
    pipeline = LivePipeline(
        golden, target, session=_session(args, options.tokens),
        poll=True if args.poll else None, poll_interval=args.poll_interval,
    )  # fmt: skip
    title = f"layerwatch run · {_name(args.golden_cmd or args.golden)} vs {_name(args.target_cmd or args.target)}"
    return present(pipeline, args, title)


def scan_pipeline(target: Any, args: argparse.Namespace) -> Any:
    """A pipeline over one side whose session is the anomaly scan (no golden run)."""
    from layerwatch.engine.live.pipeline import LivePipeline
    from layerwatch.engine.live.scan_session import ScanSession
    from layerwatch.engine.scan_report import bounds_from

    return LivePipeline(
        None, target, session=ScanSession(bounds_from(args)),  # type: ignore[arg-type]
        poll=True if getattr(args, "poll", False) else None,
        poll_interval=getattr(args, "poll_interval", 0.25),
    )  # fmt: skip


def dump_scan_main(args: argparse.Namespace) -> int:
    """``layerwatch dump --scan``: in a terminal, the scan grid as tensors land; otherwise (or
    with ``--exit-on-anomaly``) the engine's headless live scan (engine/live/scan.py)."""
    from layerwatch.engine.live import scan as live_scan

    if args.exit_on_anomaly or not interactive():
        return live_scan.dump_scan_main(args)
    from layerwatch.capture.launch import CaptureOptions, LaunchSpec
    from layerwatch.engine.live.side import SideSpec
    from layerwatch.engine.outcome import check_report_path

    if getattr(args, "format", "layerwatch") != "layerwatch" or args.dumper != "layerwatch":
        raise LayerwatchError("--scan reads layerwatch dumps: drop --format msit/--dumper msit")
    cmd = list(args.cmd or [])
    if not cmd:
        raise LayerwatchError(
            "no command given: layerwatch dump --scan --out DIR -- python infer.py ARGS..."
        )
    check_report_path(getattr(args, "scan_output", None))
    out = Path(args.out).absolute()
    launch = LaunchSpec(
        " ".join(cmd) if args.shell and len(cmd) == 1 else cmd, out,
        CaptureOptions.from_args(args), "layerwatch", shell=args.shell,
    )  # fmt: skip
    pipeline = scan_pipeline(SideSpec(out, launch), args)
    args.output, args.json = getattr(args, "scan_output", None), False
    code = present(pipeline, args, f"layerwatch dump --scan · {_name(cmd[0])} → {out.name}")
    session = pipeline.session
    for line in scan_lines(session.report):
        print(f"layerwatch scan: {line}", flush=True)
    if args.output:
        session.export(args.output)
    return code


def scan_lines(report: Any) -> list[str]:
    from layerwatch.engine.scan_report import summary_lines

    return summary_lines(report)


def check_attachable(path: str) -> None:
    """A dump directory still to be made is waited for, but only where it can appear: when
    neither the path nor its parent exists it is a typo, not a run that has yet to start."""
    where = Path(path).absolute()
    if not where.exists() and not where.parent.is_dir():
        raise LayerwatchError(f"{path}: no such directory, nor its folder {where.parent} (a typo?)")


def watch_main(args: argparse.Namespace) -> int:
    from layerwatch.engine.live.pipeline import LivePipeline, attach_spec

    for path in (args.golden, args.target):
        if path is not None:
            check_attachable(path)
    if args.target is None:  # one directory: its anomaly scan as it is written
        pipeline = scan_pipeline(attach_spec(args.golden, idle_s=args.idle), args)
        return present(pipeline, args, f"layerwatch watch · scan · {args.golden}")

    pipeline = LivePipeline(
        attach_spec(args.golden, idle_s=args.idle), attach_spec(args.target, idle_s=args.idle),
        session=_session(args), poll=True if args.poll else None, poll_interval=args.poll_interval,
    )  # fmt: skip
    return present(pipeline, args, f"layerwatch watch · {args.golden} vs {args.target}")


def open_main(args: argparse.Namespace) -> int:
    from layerwatch.engine.live.pipeline import LivePipeline, attach_spec
    from layerwatch.engine.readers import resolve

    if args.target is None:
        return open_precheck(args)
    for path, side in ((args.golden, "golden"), (args.target, "target")):
        if not Path(path).exists():
            raise LayerwatchError(f"{side} dump {path}: no such file or directory")
        resolve(path)  # several msit runs in one directory: refused, as compare does
    if getattr(args, "fake_quant", None):  # three dumps: engine/quantcmp.py
        if getattr(args, "headless", False) or not interactive():
            from layerwatch.engine.runner import compare_main

            return compare_main(args)
        from layerwatch.engine.quantcmp import QuantisationLine, kernel_args

        quant_golden, user_thresholds = args.golden, getattr(args, "thresholds", None)
        args = kernel_args(args)  # the grid shows (and colours by) the kernel part
    from layerwatch.engine.cases import dumps_have_cases

    if dumps_have_cases(args.golden, args.target):
        if getattr(args, "headless", False) or not interactive():
            from layerwatch.engine.runner import compare_main

            return compare_main(args)  # per-case dumps: compare's summary and exit
        return open_cases(args)
    session = _session(args)
    if getattr(args, "fake_quant", None):  # the operator view adds the quantisation part
        session.operator_check = QuantisationLine(
            quant_golden, args.golden, user_thresholds, session.operator_check
        )
    pipeline = LivePipeline(
        attach_spec(args.golden, idle_s=0, watch=False), attach_spec(args.target, idle_s=0, watch=False),
        session=session,
    )  # fmt: skip
    return present(pipeline, args, f"layerwatch open · {args.golden} vs {args.target}", live=False)


def open_cases(args: argparse.Namespace) -> int:
    """``layerwatch open`` of per-case dumps in the TUI: the cases list, then a case's grid."""
    from layerwatch.engine.case_sources import CaseSet
    from layerwatch.tui.app import run_app

    cases = CaseSet(args.golden, args.target, lambda: _session(args))
    with interrupt_on_signals():
        try:
            return run_app(
                None, title=f"layerwatch open · {args.golden} vs {args.target}", cases=cases
            )
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED


def open_precheck(args: argparse.Namespace) -> int:
    """``layerwatch open DUMP``: the precheck grid in the TUI; headless, ``precheck``'s output."""
    if not Path(args.golden).exists():
        raise LayerwatchError(f"{args.golden}: no such file or directory")
    if getattr(args, "headless", False) or not interactive():
        from layerwatch.engine.precheck import precheck_main

        args.dump = args.golden
        return precheck_main(args)
    from layerwatch.engine.precheck_view import PrecheckSource
    from layerwatch.tui.app import run_app

    source = PrecheckSource(args.golden)
    with interrupt_on_signals():
        try:
            run_app(source, title=f"layerwatch precheck · {args.golden}")
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
    report = source.report
    return 1 if report is not None and (report.failed or report.errors) else 0


def interactive() -> bool:
    """A person is there: a terminal on both ends, or a browser (``layerwatch serve`` runs each
    connection's app with Textual's web driver, over pipes)."""
    if "web_driver" in os.environ.get("TEXTUAL_DRIVER", ""):
        return True
    return sys.stdout.isatty() and sys.stdin.isatty()


def _name(text: str | None) -> str:
    return (text or "").strip().split("/")[-1][:40] or "?"


# --- presenting ----------------------------------------------------------------------------
@contextlib.contextmanager
def interrupt_on_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP (an SSH session closing) unwind like Ctrl-C, so ``finally`` blocks
    stop the launched children instead of leaving them running."""

    def raise_interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError):  # not the main thread
            previous[sig] = signal.signal(sig, raise_interrupt)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def present(pipeline: Any, args: argparse.Namespace, title: str, *, live: bool = True) -> int:
    """The TUI when asked for and possible, else headless printing."""
    pipeline.freeze_heap = True  # this process is ours: no long garbage-collector pauses
    if not getattr(args, "headless", False):
        try:
            from layerwatch.tui.app import run_app
        except ImportError as exc:
            print(
                f"layerwatch: the TUI is not available ({exc}); printing results instead",
                file=sys.stderr,
            )
        else:
            if interactive():
                with interrupt_on_signals():
                    try:
                        return run_app(pipeline, title=title)
                    except KeyboardInterrupt:
                        pipeline.stop()
                        return EXIT_INTERRUPTED
            print(
                "layerwatch: not a terminal; printing results instead of the TUI", file=sys.stderr
            )
    from layerwatch.engine.live.gc_tuning import FROZEN_BATCH_THRESHOLDS, batch_collections

    # no UI thread to keep frames for, and the pipeline's HeapFreezer collects once a second
    with batch_collections(FROZEN_BATCH_THRESHOLDS):
        return headless(pipeline, args, live=live)


def headless(
    pipeline: Any,
    args: argparse.Namespace,
    out: TextIO | None = None,
    err: TextIO | None = None,
    *,
    live: bool = True,
) -> int:
    from layerwatch.engine.outcome import check_report_path

    out = out or sys.stdout
    err = err or sys.stderr
    check_report_path(getattr(args, "output", None), pairs=True)  # before anything is launched
    as_json = bool(getattr(args, "json", False))
    # Finished dumps (open): stdout is exactly compare's; the early first-failure line goes to stderr.
    printer = Printer(pipeline, failures=err if as_json or not live else out, progress=err)
    interrupted = False
    with interrupt_on_signals():
        try:
            pipeline.start()
            while not pipeline.wait(0.1):
                printer.batches(pipeline.sink.drain())
        except KeyboardInterrupt:
            interrupted = True
            print("layerwatch: interrupted: stopping the commands", file=err)
        finally:
            pipeline.stop()
    printer.batches(pipeline.sink.drain())
    return report(pipeline, args, out, interrupted)


def report(pipeline: Any, args: argparse.Namespace, out: TextIO, interrupted: bool) -> int:
    """compare's ending (engine/outcome.py), after the worker's own failure; 130 when interrupted."""
    from layerwatch.engine.outcome import conclude

    session = pipeline.session
    error = getattr(pipeline, "error", None)
    if error and not interrupted:  # the worker gave up: results may be incomplete
        raise LayerwatchError(error)
    if getattr(session, "verdict_only", False):  # no golden: the scan's ending
        return scan_report(pipeline, args, out, interrupted)
    if interrupted and not session.results():
        return EXIT_INTERRUPTED
    code = conclude(
        session,
        out,
        output=getattr(args, "output", None),
        as_json=bool(getattr(args, "json", False)),
        empty="; ".join(session.notes[-3:]) or "no tensors landed on either side",
        summary_with_report=True,
        notes=pipeline.notes,
        failed_commands=pipeline.failed_commands,
        allow_partial=bool(getattr(args, "allow_partial", False)),
    )
    return EXIT_INTERRUPTED if interrupted else code


def scan_report(pipeline: Any, args: argparse.Namespace, out: TextIO, interrupted: bool) -> int:
    """``layerwatch scan``'s summary, report file and exit code for a live scan."""
    import json

    from layerwatch.engine.outcome import EXIT_FINDING, EXIT_OK

    report = pipeline.session.report
    if interrupted and not report.tensors:
        return EXIT_INTERRUPTED
    if not report.tensors and not interrupted:
        why = "; ".join(pipeline.notes[-3:]) or "no output tensors landed"
        raise LayerwatchError(f"nothing to scan: {why}")
    report.notes.extend(pipeline.notes)
    if getattr(args, "output", None):
        pipeline.session.export(args.output)
    if getattr(args, "json", False):
        out.write(json.dumps(report.to_json(), indent=1) + "\n")
    elif not getattr(args, "output", None):
        out.write("\n".join(scan_lines(report)) + "\n")
    out.flush()
    if interrupted:
        return EXIT_INTERRUPTED
    if report.rows:
        return EXIT_FINDING
    if pipeline.failed_commands:
        raise LayerwatchError("; ".join(pipeline.failed_commands))
    return EXIT_OK


class Printer:
    """Headless progress: what changed, throttled; the first failure at once."""

    def __init__(self, pipeline: Any, *, failures: TextIO, progress: TextIO) -> None:
        self.pipeline = pipeline
        self.failures = failures
        self.progress = progress
        self.first: Any = None
        self.parted: Any = None
        self.runs: dict[str, Any] = {}
        self.pairs = 0
        self.failed = 0
        self._last = 0.0
        self._said = ""

    def batches(self, batches: list[Any]) -> None:
        from layerwatch.engine.wording import finding_words, run_progress_words

        for batch in batches:
            for status in batch.runs.values():
                before = self.runs.get(status.side)
                self.runs[status.side] = status
                if before is None or (before.state, before.message) != (
                    status.state,
                    status.message,
                ):
                    print(
                        f"layerwatch: {status.side}: {run_progress_words(status)}",
                        file=self.progress,
                        flush=True,
                    )
            for note in batch.notes:
                if note != getattr(self.pipeline, "error", None):  # the exit line says it
                    print(f"layerwatch: note: {note}", file=self.progress, flush=True)
            self.pairs, self.failed = batch.summary.pairs, batch.summary.failed
            first = batch.first_failure
            if first is not None and (
                self.first is None
                or (first.token, first.node, first.stem)
                != (self.first.token, self.first.node, self.first.stem)
            ):
                again = " (an earlier one landed)" if self.first is not None else ""
                self.first = first
                words = finding_words(first, self.pipeline.session.blocks())
                print(f"first failure{again}: {words}", file=self.failures, flush=True)
            if self.parted is None and batch.summary.diverged:
                self._divergence()
        self._tick()

    def _divergence(self) -> None:
        """Say where the outputs part as soon as the first diverged token lands (once: the step
        and ids do not change when later tokens land; the counts do, so the final summary
        says them)."""
        from layerwatch.engine.wording import divergence_words

        parted = getattr(self.pipeline.session, "divergence", None)
        if parted is not None:
            self.parted = parted
            print(f"layerwatch: {divergence_words(parted, None)}", file=self.failures, flush=True)

    def _tick(self) -> None:
        now = time.monotonic()
        if now - self._last < PROGRESS_EVERY or not (self.runs or self.pairs):
            return
        sides = " · ".join(
            f"{s.side} {s.tokens} tokens {s.tensors} tensors" for s in self.runs.values()
        )
        line = f"layerwatch: {sides + ' · ' if sides else ''}{self.pairs} pairs compared, {self.failed} fail"
        if line != self._said:
            self._last, self._said = now, line
            print(line, file=self.progress, flush=True)
