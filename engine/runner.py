"""``layerwatch compare GOLDEN TARGET``: two finished dumps in, a verdict and a report out.

Exit codes: 0 every pair passes, 1 something fails (a FAIL or an ERROR pair), 2 bad usage or
unreadable input (a one-line message via :class:`LayerwatchError`, printed by the CLI).
Unpaired tensors are reported but do not fail the run. Start-up stays cheap: no torch and no
pandas on this path (readers parse ``.pth`` zips themselves).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from layerwatch.capture.errors import LayerwatchError

if TYPE_CHECKING:
    from concurrent.futures import Future

    from .forked import Forked
    from .readers import ReaderUpdate

EXIT_OK = 0
EXIT_FAIL = 1


class _Progress:
    """``comparing 123/468 pairs`` on stderr, only when stderr is a terminal."""

    def __init__(self) -> None:
        self.enabled = sys.stderr.isatty()
        self._last = 0.0

    def say(self, text: str, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if force or now - self._last > 0.1:
            self._last = now
            sys.stderr.write(f"\r\033[K{text}")
            sys.stderr.flush()

    def pairs(self, done: int, total: int) -> None:
        self.say(f"layerwatch compare: {done}/{total} pairs", force=done == total)

    def clear(self) -> None:
        if self.enabled:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _check_path(path: str, side: str) -> None:
    p = Path(path)
    if not p.exists():
        raise LayerwatchError(f"{side} dump {path}: no such file or directory")


def read_dump(path: str, side: str) -> ReaderUpdate:
    """Everything in a finished dump (top level: runs in a worker process too)."""
    from .readers import open_dump

    return open_dump(path, side=side).poll(None)


def _result_or_none(
    future: Future[ReaderUpdate] | Forked[ReaderUpdate] | None,
) -> ReaderUpdate | None:
    """A worker's dump, or ``None`` when the worker died (the caller reads it itself)."""
    if future is None:
        return None
    try:
        return future.result()
    except LayerwatchError:
        raise
    except Exception:  # BrokenProcessPool...: the dump is read here instead
        return None


def compare_main(args: argparse.Namespace) -> int:
    from layerwatch.capture.tokens import parse_tokens

    from .forked import Forked, can_fork
    from .readers import open_dump
    from .report import dumps_json, json_report, summary_text, write_csv
    from .session import CompareSession

    tokens = parse_tokens(args.tokens) if getattr(args, "tokens", None) else None
    jobs = getattr(args, "jobs", 0) or 0
    if jobs < 0:
        raise LayerwatchError(f"--jobs must be 0 (all cores) or more, not {jobs}")
    _check_path(args.golden, "golden")
    _check_path(args.target, "target")
    progress = _Progress()
    progress.say("layerwatch compare: reading dumps", force=True)
    readers = {
        "golden": open_dump(args.golden, side="golden"),
        "target": open_dump(args.target, side="target"),
    }
    session = CompareSession(
        thresholds=getattr(args, "thresholds", None),
        mapping=getattr(args, "map", None),
        tokens=tokens,
        jobs=jobs,
        auto_map=True if getattr(args, "auto_map", False) else None,
    )
    try:
        # With jobs > 1, parse the two dumps in parallel: the golden one in a worker process
        # (a forked child where fork is safe: no pool, whose threads would then forbid fork).
        golden: Future[ReaderUpdate] | Forked[ReaderUpdate] | None = None
        if session.runner.jobs > 1:
            golden = (
                Forked(read_dump, args.golden, "golden")
                if can_fork()
                else session.runner.submit(read_dump, args.golden, "golden")
            )
        updates = {"target": readers["target"].poll(None)}
        updates["golden"] = _result_or_none(golden) or readers["golden"].poll(None)
        for side in ("golden", "target"):
            session.add_update(side, updates[side])
            session.finish(side)
        session.flush(progress=progress.pairs if progress.enabled else None)
    finally:
        session.close()
        progress.clear()
    results = session.results()
    if not results:
        raise LayerwatchError(
            f"nothing to compare: no tensors in {args.golden} and {args.target}"
            + (f" for tokens {args.tokens}" if tokens else "")
        )
    summary = session.summary
    if getattr(args, "output", None):
        out = Path(args.output)
        try:
            with open(out.with_name(f".tmp-{out.name}"), "w", encoding="utf-8", newline="") as fh:
                write_csv(results, fh)
            out.with_name(f".tmp-{out.name}").replace(out)
        except OSError as exc:
            raise LayerwatchError(f"cannot write {out}: {exc.strerror or exc}") from None
    if getattr(args, "json", False):
        report = json_report(
            results, summary, session.first_failure, session.root_cause, session.first_bad_token
        )
        sys.stdout.write(dumps_json(report) + "\n")
    elif not getattr(args, "output", None):
        sys.stdout.write(summary_text(session) + "\n")
    return EXIT_FAIL if summary.failed or summary.error else EXIT_OK
