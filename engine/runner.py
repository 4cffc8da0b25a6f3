"""``layerwatch compare GOLDEN TARGET``: two finished dumps in, a verdict and a report out.

Exit codes and report files are engine/outcome.py's (the same for every front end): 0 every
pair passes, 1 a finding, 2 bad usage, unreadable or mismatched input. Start-up stays cheap: no torch and no
pandas on this path (readers parse ``.pth`` zips themselves).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from layerwatch.capture.errors import LayerwatchError


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


def compare_main(args: argparse.Namespace) -> int:
    from layerwatch.capture.tokens import parse_tokens
    from layerwatch.engine.numerics.blas import env_before_numpy

    env_before_numpy()  # one BLAS thread per compare process (engine/numerics/blas.py says why)

    from layerwatch.engine.outcome import check_report_path, conclude
    from layerwatch.engine.readers import open_dump
    from layerwatch.engine.session.core import CompareSession

    tokens = parse_tokens(args.tokens) if getattr(args, "tokens", None) else None
    jobs = getattr(args, "jobs", 0) or 0
    if jobs < 0:
        raise LayerwatchError(f"--jobs must be 0 (all cores) or more, not {jobs}")
    _check_path(args.golden, "golden")
    _check_path(args.target, "target")
    from layerwatch.engine.logitscmp import compare_logits_main, is_logits_pair

    if is_logits_pair(args.golden, args.target):  # msit logitscmp folders: per-case logits
        return compare_logits_main(args)
    check_report_path(getattr(args, "output", None))

    def make_session(thresholds: object = None) -> CompareSession:
        return CompareSession(
            thresholds=thresholds or getattr(args, "thresholds", None),
            mapping=getattr(args, "map", None),
            tokens=tokens,
            jobs=jobs,
            auto_map=True if getattr(args, "auto_map", False) else None,
            side_stats=bool(getattr(args, "output", None)),  # msit's max/min/mean CSV columns
        )

    if getattr(args, "fake_quant", None):  # three dumps: quantisation vs kernel error
        from layerwatch.engine.quantcmp import quant_compare_main

        return quant_compare_main(args, make_session)
    progress = _Progress()
    progress.say("layerwatch compare: reading dumps", force=True)
    readers = {
        "golden": open_dump(args.golden, side="golden"),
        "target": open_dump(args.target, side="target"),
    }
    session = make_session()
    try:
        # Parsed here, one after the other: a second process parsing one dump in parallel saved
        # ~25 ms on a quiet box and cost ~60 ms on a busy one (the records must be pickled
        # back), while each dump parses in ~40 ms per thousand .pth files.
        updates = {side: reader.poll(None, final=True) for side, reader in readers.items()}
        from layerwatch.engine.cases import compare_cases, conclude_cases, has_cases

        if has_cases(*updates.values()):  # several prompts in one dump: case by case
            return conclude_cases(
                compare_cases(updates, make_session),
                sys.stdout,
                output=getattr(args, "output", None),
                as_json=bool(getattr(args, "json", False)),
            )
        for side in ("golden", "target"):
            session.add_update(side, updates[side])
            session.finish(side)
        session.flush(progress=progress.pairs if progress.enabled else None)
    finally:
        session.close()
        progress.clear()
    return conclude(
        session,
        sys.stdout,
        output=getattr(args, "output", None),
        as_json=bool(getattr(args, "json", False)),
        empty=f"no tensors in {args.golden} and {args.target}"
        + (f" for tokens {args.tokens}" if tokens else ""),
        summary_with_report=False,
        allow_partial=bool(getattr(args, "allow_partial", False)),
    )
