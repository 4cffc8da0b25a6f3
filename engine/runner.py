"""``layerwatch compare GOLDEN TARGET``: two finished dumps in, a verdict and a report out.

Exit codes and report files are engine/outcome.py's (the same for every front end): 0 every
pair passes, 1 a finding, 2 bad usage, unreadable or mismatched input. Start-up stays cheap: no torch and no
pandas on this path (readers parse ``.pth`` zips themselves).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from layerwatch.capture.errors import LayerwatchError

if TYPE_CHECKING:
    from layerwatch.capture.tokens import TokenSelection
    from layerwatch.engine.readers.base import ReaderUpdate
    from layerwatch.engine.session.budget import Estimate
    from layerwatch.engine.session.core import CompareSession


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


def _spread_ranks(updates: dict, args: argparse.Namespace) -> None:
    """A single-card golden against a tensor-parallel target: the golden per target rank,
    sharded tensors as their slices (engine/session/ranks.py); absent ranks named."""
    from layerwatch.engine.session import ranks

    golden, target = updates["golden"], updates["target"]
    world = ranks.world_size(args.target)
    if not ranks.spread_updates(golden, target, world, getattr(args, "map", None)):
        return
    present = {r.key.rank for r in target.tensors}
    for missing in sorted(set(range(world or 0)) - present):
        target.notes.append(f"rank {missing} of {world} has no tensors in {args.target}")


def compare_main(args: argparse.Namespace) -> int:
    """``layerwatch compare``: the collector runs rarer meanwhile (engine/live/gc_tuning.py)."""
    from layerwatch.engine.live.gc_tuning import batch_collections

    with batch_collections():
        return _compare_main(args)


def _compare_main(args: argparse.Namespace) -> int:
    from layerwatch.capture.tokens import parse_tokens
    from layerwatch.engine.numerics.blas import env_before_numpy

    env_before_numpy()  # one BLAS thread per compare process (engine/numerics/blas.py says why)

    from layerwatch.engine.outcome import check_report_path, conclude_compare
    from layerwatch.engine.readers import open_dump
    from layerwatch.engine.session.budget import Estimate, check, parse_size
    from layerwatch.engine.session.core import CompareSession

    tokens = parse_tokens(args.tokens) if getattr(args, "tokens", None) else None
    jobs = getattr(args, "jobs", 0) or 0
    if jobs < 0:
        raise LayerwatchError(f"--jobs must be 0 (a process per idle core) or more, not {jobs}")
    if getattr(args, "ray", None):  # the target's ranks live on the cluster's nodes
        from layerwatch.engine.raycompare import ray_compare_main

        return ray_compare_main(args)
    _check_path(args.golden, "golden")
    _check_path(args.target, "target")
    from layerwatch.engine.readers.logitsdir import detect

    if detect(args.golden) and detect(args.target):  # msit logitscmp folders: per-case logits
        from layerwatch.engine.logitscmp import compare_logits_main

        return compare_logits_main(args)
    output = getattr(args, "output", None)
    as_json = bool(getattr(args, "json", False))
    check_report_path(output, pairs=True)
    limit = getattr(args, "max_memory", None)
    limit_bytes = parse_size(limit) if limit else None

    def make_session(thresholds: object = None) -> CompareSession:
        return CompareSession(
            thresholds=thresholds or getattr(args, "thresholds", None),
            mapping=getattr(args, "map", None),
            tokens=tokens,
            jobs=jobs,
            auto_map=True if getattr(args, "auto_map", False) else None,
            side_stats=bool(output),  # msit's max/min/mean CSV columns
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
    nodes = getattr(args, "nodes", None)
    keep = (lambda update: update.only_nodes(nodes)) if nodes else (lambda update: update)
    empty = f"no tensors in {args.golden} and {args.target}" + (
        f" for tokens {args.tokens}" if tokens else ""
    )
    chunked = _chunked(readers, tokens, args)
    if chunked is not None:
        check(chunked[0], limit_bytes)
        return _compare_windowed(args, chunked[1], make_session, keep, progress, empty)
    cased = _case_tables(readers, args, keep)
    if cased is not None:  # several prompts: a case's records read when its turn comes
        from layerwatch.engine.cases import stream_cases

        progress.clear()
        heads, slicer = cased
        return stream_cases(
            heads, make_session, sys.stdout, output=output, as_json=as_json, slicer=slicer
        )
    session = make_session()
    try:
        # Parsed here, one after the other: a second process parsing one dump in parallel saved
        # ~25 ms on a quiet box and cost ~60 ms on a busy one (the records must be pickled
        # back), while each dump parses in ~40 ms per thousand .pth files.
        updates = {side: keep(reader.poll(None, final=True)) for side, reader in readers.items()}
        _spread_ranks(updates, args)
        from layerwatch.engine.cases import has_cases, stream_cases

        if has_cases(*updates.values()):  # several prompts in one dump: case by case
            return stream_cases(updates, make_session, sys.stdout, output=output, as_json=as_json)
        n = len(updates["golden"].tensors)
        check(Estimate(n, len(updates["golden"].token_ids) or 1, windowed=False), limit_bytes)
        session.compare_finished(
            updates["golden"], updates["target"], progress.pairs if progress.enabled else None
        )
    finally:
        session.close()
        progress.clear()
    return conclude_compare(args, session, empty)


def _chunked(
    readers: dict[str, Any], tokens: TokenSelection | None, args: argparse.Namespace
) -> tuple[Estimate, dict[str, Any]] | None:
    """Both dumps can be compared a window of tokens at a time: (the estimate of that compare's
    size, a chunk reader per side). layerwatch indexes are read a chunk at a time, msit and ATB
    a token directory at a time, msprobe a token of its ``dump.json`` streams at a time
    (engine/session/windowed.py). None: the whole-run path (a layerwatch dump with cases or
    dropped files needs every record at once; other formats)."""
    from layerwatch.engine.session.budget import Estimate

    # By format name, not class: importing every reader would undo open_dump's per-format imports.
    if not all(r.fmt in ("layerwatch", "msit", "atb", "msprobe") for r in readers.values()):
        return None
    sizes: dict[str, tuple[int, int]] = {}
    rows = 0  # tensor lines kept a row each; 0: both indexes folded per token (scan_file)
    for side, reader in readers.items():
        if reader.fmt == "layerwatch":
            scan = reader.scan_index(getattr(args, "nodes", None))
            if scan.cases or (scan.drops and any(r.fmt != "layerwatch" for r in readers.values())):
                return None  # a drop line is known up front only from the index's columns
            sizes[side] = (scan.tensors, scan.tokens)
            rows += scan.rows
        elif reader.fmt in ("msit", "atb"):
            sizes[side] = reader.count_tensors()
        elif side == "golden":  # msprobe: its first token counted, scaled by its files' size
            sizes[side] = reader.estimate()
    n, count = sizes["golden"]
    share = 1.0
    if tokens is not None and count:
        share = sum(t in tokens for t in range(count)) / count
    folded = not rows and all(r.fmt == "layerwatch" for r in readers.values())
    return Estimate(int(n * share), count or 1, windowed=True, folded=folded), dict(readers)


def _case_tables(
    readers: dict[str, Any], args: argparse.Namespace, keep: Callable[[ReaderUpdate], ReaderUpdate]
) -> tuple[dict[str, ReaderUpdate], Callable[[Any, Any], ReaderUpdate]] | None:
    """Two finished layerwatch dumps with cases, each opened as columns (engine/readers/
    index_columns.py: 24 B a tensor line, no record): (each side's case lines, token ids,
    topology and weights; what builds one case's records, ``keep`` applied, tokens renumbered
    as engine/cases.py ``slice_update`` does). None: the whole read (another format, a single
    case, a tensor-parallel target whose golden is spread over its ranks)."""
    from layerwatch.engine.cases import has_cases, slice_update
    from layerwatch.engine.readers.base import ReaderUpdate
    from layerwatch.engine.session.ranks import world_size

    if any(r.fmt != "layerwatch" for r in readers.values()) or (world_size(args.target) or 1) > 1:
        return None
    tables = {side: reader.open_columns().compact() for side, reader in readers.items()}
    if not has_cases(*(t.head for t in tables.values())):
        return None

    def slicer(side: str, span: Any) -> ReaderUpdate:
        head = tables[side].head
        high = span.end - 1 if span.end is not None else 1 << 62
        tensors, _ = tables[side].records(span.begin, high)  # notes: a case keeps none
        update = ReaderUpdate(
            tensors=tensors,
            topology=head.topology,
            token_ids=head.token_ids,
            complete=head.complete,
            weights=head.weights,
        )
        return slice_update(keep(update), span)

    return {side: t.head for side, t in tables.items()}, slicer


def _compare_windowed(
    args: argparse.Namespace,
    readers: dict[str, Any],
    make_session: Callable[[], CompareSession],
    keep: Callable[[ReaderUpdate], ReaderUpdate],
    progress: _Progress,
    empty: str,
) -> int:
    """engine/session/windowed.py: rows are written as each window of tokens is judged; a run
    stopped part-way (Ctrl-C, a full disk) keeps them in a report marked incomplete."""
    from layerwatch.engine.outcome import ReportStream, conclude_compare
    from layerwatch.engine.session.windowed import WindowedRun, compare_windows

    output = getattr(args, "output", None)
    as_json = bool(getattr(args, "json", False))
    from layerwatch.engine.session.ranks import WindowSpread, world_size

    stream = ReportStream(output, sys.stdout if as_json else None)
    nodes = getattr(args, "nodes", None)
    chunks = {side: _Filtered(reader, keep, nodes) for side, reader in readers.items()}
    spread = WindowSpread(world_size(args.target), getattr(args, "map", None))
    run = WindowedRun()
    try:
        run = compare_windows(
            chunks,
            make_session,
            stream,
            progress=progress.pairs if progress.enabled else None,
            run=run,
            prepare=spread,
        )
        for note in spread.notes(args.target):
            run.note(f"target: {note}")  # as the session words a side's notes
    except KeyboardInterrupt:
        progress.clear()
        said = ""  # the command line's one line, `layerwatch compare: interrupted…` (tui/cli.py)
        if output and stream.rows:
            stream.json_out = None  # stdout gets nothing of a run cut short
            stream.finish(run, incomplete=f"stopped by the user after {stream.rows} rows")
            said = f"interrupted; {output} holds the rows so far"
        else:
            stream.discard()
            if output:
                said = f"interrupted before a row was written to {output}"
        raise KeyboardInterrupt(said) from None
    except LayerwatchError as exc:  # cannot write the report (a full disk...)
        progress.clear()
        if output and stream.rows:
            stream.json_out = None
            with contextlib.suppress(LayerwatchError):
                stream.finish(run, incomplete=f"stopped after {stream.rows} rows: {exc}")
        else:
            stream.discard()
        raise
    finally:
        progress.clear()
    return conclude_compare(args, run, empty, stream=stream)


class _Filtered:
    """A chunk reader whose updates pass through ``keep`` (``--nodes``)."""

    def __init__(
        self, reader: Any, keep: Callable[[ReaderUpdate], ReaderUpdate], nodes: str | None = None
    ) -> None:
        self.reader = reader
        self.keep = keep
        self.nodes = nodes

    def open_columns(self) -> Any:
        """The reader's column table (engine/session/column_windows.py), ``--nodes`` applied
        before any record is built; None when the reader has none."""
        opener = getattr(self.reader, "open_columns", None)
        if opener is None:
            return None
        table = opener()
        return table.only_nodes(self.nodes) if self.nodes else table

    def poll_chunk(self, limit: int) -> ReaderUpdate | None:
        update = self.reader.poll_chunk(limit)
        return None if update is None else self.keep(update)

    def forget_before(self, token: int) -> None:
        forget = getattr(self.reader, "forget_before", None)
        if forget is not None:
            forget(token)
