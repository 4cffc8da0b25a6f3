"""``layerwatch allreduce DUMP``: is every rank's all-reduce result the reduction of all inputs?

The tensor-parallel check of msit's ``allreduce.py``: for each all-reduce call (a node of type
``all_reduce`` at one token, captured on every rank by ``capture/collectives.py``; or an ATB
``AllReduce`` operator in each device's folder, read by ``engine/readers/atb.py``) the golden is
the reduction of all ranks' inputs in float64 (SUM, or MAX/MIN/AVG/PRODUCT as the call's
``collective`` index line says), compared with each rank's output under the thresholds of the
output's dtype (``engine/thresholds.toml``). A rank that is missing, stopped early or made a
different number of calls is named in one line each (``notes``); every call whose inputs are
all there is still checked. Nothing checkable at all is unusable input (exit 2). Several
paths (msit's ``--process_0_path --process_1_path``) are one rank each, in the order given.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from layerwatch.capture import format as lwf
from layerwatch.capture.errors import LayerwatchError
from layerwatch.capture.framing import whole_lines
from layerwatch.engine.readers.base import RankIndex, scandir
from layerwatch.engine.readers.load import canonical_dtype, load_array
from layerwatch.engine.records import Locator, Verdict
from layerwatch.engine.wording import note_lines

NODE_TYPE = "all_reduce"
REDUCE = {
    "SUM": np.add,
    "AVG": np.add,
    "MAX": np.maximum,
    "MIN": np.minimum,
    "PRODUCT": np.multiply,
}


@dataclass(slots=True)
class _Call:
    """One all-reduce call on one rank: its input and output as stored, and the op."""

    inp: Locator | None = None
    out: Locator | None = None
    dtype: str = ""
    order: int = -1
    op: str = "SUM"


@dataclass(slots=True)
class _Rank:
    path: Path
    rank: int
    world_size: int | None
    status: str
    calls: dict[tuple[int, str], _Call] = field(default_factory=dict)
    last_token: int = -1
    ended: bool = False


@dataclass(frozen=True, slots=True)
class ReduceRow:
    """One rank's output of one call against the reduction of every rank's input."""

    token: int
    node: str
    rank: int
    op: str
    dtype: str
    shape: tuple[int, ...]
    verdict: Verdict
    metrics: dict[str, float]
    failed: tuple[str, ...] = ()
    reason: str = ""
    order: int = -1

    def to_json(self) -> dict[str, Any]:
        return {
            "token": self.token,
            "node": self.node,
            "rank": self.rank,
            "op": self.op,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "verdict": self.verdict.value,
            "failed_metrics": list(self.failed),
            "metrics": {k: (v if np.isfinite(v) else None) for k, v in self.metrics.items()},
            "reason": self.reason,
        }


@dataclass
class AllReduceReport:
    rows: list[ReduceRow]
    notes: list[str]
    world_size: int
    ranks: list[int]
    calls: int
    """Distinct (token, node) calls seen on any rank."""
    unchecked: int
    """Calls whose inputs are not all there (a rank missing or truncated)."""
    nbytes: int = 0
    """Bytes of tensors read (inputs and outputs), for the throughput figure."""
    seconds: float = 0.0

    @property
    def first_failure(self) -> ReduceRow | None:
        bad = [r for r in self.rows if r.verdict is not Verdict.PASS]
        return min(bad, key=lambda r: (r.token, r.order, r.node, r.rank)) if bad else None

    def summary(self) -> dict[str, Any]:
        count: defaultdict[str, int] = defaultdict(int)
        for row in self.rows:
            count[row.verdict.value] += 1
        return {
            "world_size": self.world_size,
            "ranks": self.ranks,
            "calls": self.calls,
            "checked": self.calls - self.unchecked,
            "unchecked": self.unchecked,
            "rows": len(self.rows),
            "pass": count["pass"],
            "fail": count["fail"],
            "error": count["error"],
        }

    def to_json(self) -> dict[str, Any]:
        first = self.first_failure
        return {
            "summary": self.summary(),
            "first_failure": None if first is None else first.to_json(),
            "notes": list(self.notes),
            "rows": [r.to_json() for r in self.rows],
        }


# --- reading --------------------------------------------------------------------------------
def _rank_dirs(path: Path) -> tuple[list[Path], bool]:
    """(rank directories, whether ``path`` itself is one)."""
    if (path / lwf.INDEX).is_file() or (path / lwf.MANIFEST).is_file():
        return [path], True
    dirs = [
        Path(e.path)
        for e in scandir(path)
        if e.is_dir()
        and ((Path(e.path) / lwf.INDEX).is_file() or (Path(e.path) / lwf.MANIFEST).is_file())
    ]
    return dirs, False


def _manifest(path: Path) -> dict[str, Any]:
    try:
        obj = json.loads((path / lwf.MANIFEST).read_bytes())
    except (OSError, ValueError):
        return {}
    return obj if isinstance(obj, dict) else {}


def _read_rank(path: Path, rank: int, notes: list[str]) -> _Rank:
    man = _manifest(path)
    if isinstance(man.get("rank"), int):
        rank = man["rank"]
    world = man.get("world_size")
    state = _Rank(path, rank, world if isinstance(world, int) else None, str(man.get("status", "")))
    try:
        data = (path / lwf.INDEX).read_bytes()
    except OSError as exc:
        notes.append(f"rank {rank}: cannot read {path / lwf.INDEX}: {exc.strerror}")
        return state
    whole = whole_lines(data)
    if data[whole:].strip():
        notes.append(f"rank {rank}: the last index line of {path.name} is cut short, skipped")
    for line in data[:whole].splitlines():
        if (
            NODE_TYPE.encode() not in line
            and b'"k":"end"' not in line
            and b'"k":"token"' not in line
        ):
            continue  # most lines are other nodes' tensors: skip them unparsed
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        kind = obj.get("k")
        if kind == lwf.K_TOKEN and isinstance(obj.get("token"), int):
            state.last_token = max(state.last_token, obj["token"])
        elif kind == lwf.K_END:
            state.ended = True
        elif kind == lwf.K_TENSOR and obj.get("type") == NODE_TYPE:
            try:
                entry = lwf.IndexTensor.from_json(obj)
            except (KeyError, TypeError, ValueError):
                continue
            call = state.calls.setdefault((entry.token, entry.node), _Call())
            call.order = entry.order
            if not entry.file:
                continue  # statistics only: nothing to reduce
            dtype = canonical_dtype(entry.dtype)
            loc = Locator(
                str(path / entry.file), entry.begin, entry.end - entry.begin, dtype, entry.shape
            )
            if entry.stem.startswith("input"):
                call.inp = loc
            elif entry.stem.startswith("output"):
                call.out, call.dtype = loc, dtype
        elif kind == lwf.K_COLLECTIVE and obj.get("type") == NODE_TYPE:
            key = (int(obj.get("token", -1)), str(obj.get("node", "")))
            state.calls.setdefault(key, _Call()).op = str(obj.get("op") or "SUM").upper()
    return state


def _is_allreduce(node_type: str) -> bool:
    """Our ``all_reduce`` nodes, ATB's ``AllReduceOperation`` (msit's ``AllReduceHcclRunner``
    dumps), any type naming an all-reduce."""
    return "allreduce" in node_type.lower().replace("_", "")


def _foreign_ranks(path: Path, notes: list[str]) -> list[_Rank]:
    """All-reduce operators of a dump in another format (ATB ``.bin`` per device, msit,
    msprobe) through its reader: one rank per rank directory the reader found; SUM."""
    from layerwatch.engine.readers import open_dump

    update = open_dump(path).poll(None, final=True)
    notes.extend(update.notes)
    ranks: dict[int, _Rank] = {}
    for rec in update.tensors:
        if not _is_allreduce(rec.node_type) or rec.loc is None:
            continue
        state = ranks.setdefault(rec.key.rank, _Rank(path, rec.key.rank, None, "", ended=True))
        call = state.calls.setdefault((rec.key.token, rec.key.node), _Call())
        call.order = rec.order
        state.last_token = max(state.last_token, rec.key.token)
        stem = rec.key.stem
        if stem.startswith("input") and (call.inp is None or stem in ("input", "input_0")):
            call.inp = rec.loc
        elif stem.startswith("output") and (call.out is None or stem in ("output", "output_0")):
            call.out, call.dtype = rec.loc, rec.dtype
    return [ranks[k] for k in sorted(ranks)]


def _read_path(path: Path, notes: list[str]) -> tuple[list[_Rank], bool]:
    """(the ranks under ``path``, whether ``path`` itself is one layerwatch rank directory)."""
    if not path.exists():
        raise LayerwatchError(f"{path}: no such directory")
    dirs, single = _rank_dirs(path)
    if not dirs:
        from layerwatch.engine.readers import detect

        found = _foreign_ranks(path, notes) if detect(path) is not None else []
        if not found:
            raise LayerwatchError(
                f"{path} holds no all-reduce calls: expected layerwatch rank directories "
                "(rank0/, rank1/ ... from a torchrun capture) or an ATB dump with AllReduce "
                "operators (ATB_SAVE_TENSOR_RUNNER=AllReduceHcclRunner)"
            )
        return found, False
    index = RankIndex()
    index.assign([d.name for d in dirs])
    return [_read_rank(d, index(d.name), notes) for d in dirs], single


def read_ranks(*paths: str | Path) -> tuple[list[_Rank], int, list[str]]:
    """Every rank's all-reduce calls, the world size, and one-line notes. One path: a dump
    holding every rank; several (msit's ``--process_0_path --process_1_path``): one rank each,
    numbered in the order given."""
    notes: list[str] = []
    roots = [Path(p) for p in paths]
    if len(roots) == 1:
        root = roots[0]
        ranks, single = _read_path(root, notes)
    else:
        ranks, single = [], False
        for i, path in enumerate(roots):
            found, _ = _read_path(path, notes)
            if len(found) != 1:
                raise LayerwatchError(
                    f"{path} holds {len(found)} ranks: give one rank directory per path, or "
                    "the one directory holding them all"
                )
            found[0].rank = i
            ranks += found
        root = roots[0].parent
    ranks.sort(key=lambda r: r.rank)
    worlds = {r.world_size for r in ranks if r.world_size is not None}
    world = max(worlds) if worlds else len(ranks)
    if len(worlds) > 1:
        notes.append(f"the ranks disagree on the world size ({sorted(worlds)}); using {world}")
    if single and world > 1:
        raise LayerwatchError(
            f"{root} is rank {ranks[0].rank} of {world}: the all-reduce check needs every "
            f"rank's inputs, pass the directory holding all of them ({root.parent})"
        )
    if world < 2:
        notes.append(f"{root} holds one rank only: an all-reduce of one rank is a copy")
    present = {r.rank for r in ranks}
    for missing in sorted(set(range(world)) - present):
        notes.append(
            f"rank {missing} of {world} is missing (no rank{missing}/ in {root}): calls need "
            "every rank's input, those it took part in cannot be checked"
        )
    counts = {r.rank: len(r.calls) for r in ranks}
    if len(set(counts.values())) > 1:
        notes.append(
            "the ranks made different numbers of all-reduce calls: "
            + ", ".join(f"rank {k} {v}" for k, v in counts.items())
        )
    most = max(counts.values(), default=0)
    for r in ranks:
        if not r.ended or r.status not in ("", lwf.STATUS_COMPLETE):
            notes.append(
                f"rank {r.rank}: its dump did not finish (status {r.status or 'unknown'}, last "
                f"token {r.last_token}): {most - len(r.calls)} calls fewer than the most"
            )
    return ranks, world, notes


# --- checking -------------------------------------------------------------------------------
def check_allreduce(path: str | Path | list[str | Path], thresholds: Any = None) -> AllReduceReport:
    """Check every all-reduce call of the multi-rank dump at ``path`` (or of the rank
    directories in a list, one rank each: :func:`read_ranks`), as the module docstring says."""
    from layerwatch.engine.numerics.arrays import compare_arrays
    from layerwatch.engine.numerics.thresholds import Thresholds

    th = thresholds if isinstance(thresholds, Thresholds) else Thresholds.load(thresholds)
    started = time.perf_counter()
    ranks, world, notes = read_ranks(*(path if isinstance(path, list) else [path]))
    keys = sorted(
        {k for r in ranks for k in r.calls},
        key=lambda k: (k[0], min(r.calls[k].order for r in ranks if k in r.calls), k[1]),
    )
    rows: list[ReduceRow] = []
    unchecked = 0
    nbytes = 0
    complete = len(ranks) == world
    for token, node in keys:
        calls = {r.rank: r.calls.get((token, node)) for r in ranks}
        if not complete or any(c is None or c.inp is None for c in calls.values()):
            unchecked += 1
            continue
        first = next(c for c in calls.values() if c is not None)
        op = first.op
        if op not in REDUCE:
            notes.append(f"token {token} · {node}: reduction {op} is not checked")
            unchecked += 1
            continue
        golden: np.ndarray | None = None
        shape_error = ""
        for rank, call in calls.items():
            assert call is not None and call.inp is not None
            x = load_array(call.inp, as_float=True)
            nbytes += call.inp.nbytes
            if golden is None:
                golden = x.astype(np.float64, copy=True)
            elif x.shape != golden.shape:
                shape_error = f"rank {rank}'s input is {list(x.shape)}, not {list(golden.shape)}"
                break
            else:
                REDUCE[op](golden, x, out=golden)
        if golden is not None and op == "AVG":
            golden /= world
        for rank, call in calls.items():
            assert call is not None
            order = call.order
            if call.out is None:
                rows.append(
                    ReduceRow(token, node, rank, op, "", (), Verdict.ERROR, {}, (), "no output")
                )
                continue
            shape = tuple(call.out.shape)
            if shape_error or golden is None or shape != golden.shape:
                why = shape_error or f"output {list(shape)} vs inputs {list(golden.shape)}"  # type: ignore[union-attr]
                rows.append(
                    ReduceRow(
                        token, node, rank, op, call.dtype, shape, Verdict.ERROR, {}, (), why, order
                    )
                )
                continue
            out = load_array(call.out, as_float=True)
            nbytes += call.out.nbytes
            metrics = compare_arrays(golden, out)
            verdict, failed, reason = th.judge(
                metrics, node=node, golden_dtype=call.dtype, target_dtype=call.dtype, stem="output"
            )
            rows.append(
                ReduceRow(
                    token,
                    node,
                    rank,
                    op,
                    call.dtype,
                    shape,
                    verdict,
                    metrics,
                    failed,
                    reason,
                    order,
                )
            )
    if unchecked and complete:
        notes.append(f"{unchecked} of {len(keys)} calls lack some rank's input: not checked")
    return AllReduceReport(
        rows,
        notes,
        world,
        [r.rank for r in ranks],
        len(keys),
        unchecked,
        nbytes,
        time.perf_counter() - started,
    )


# --- the command ----------------------------------------------------------------------------
CSV_COLUMNS = (
    "token",
    "node",
    "rank",
    "op",
    "dtype",
    "shape",
    "verdict",
    "failed_metrics",
    "reason",
)


def write_csv(report: AllReduceReport, out: TextIO) -> None:
    names = sorted({k for r in report.rows for k in r.metrics})
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*CSV_COLUMNS, *names])
    for r in report.rows:
        writer.writerow(
            [
                r.token,
                r.node,
                r.rank,
                r.op,
                r.dtype,
                json.dumps(list(r.shape)),
                r.verdict.value,
                ";".join(r.failed),
                r.reason,
                *(r.metrics.get(n, "") for n in names),
            ]
        )


def summary_lines(report: AllReduceReport) -> list[str]:
    s = report.summary()
    lines = [
        f"all-reduce check: {s['checked']} of {s['calls']} calls over {len(report.ranks)} of "
        f"{report.world_size} ranks; {s['pass']} rank results pass, {s['fail']} fail, "
        f"{s['error']} unreadable"
    ]
    first = report.first_failure
    if first is not None:
        lines.append(
            f"first failure: token {first.token} · {first.node} · rank {first.rank} "
            f"({first.op}): {first.reason or first.verdict.value}"
        )
    lines.extend(note_lines(report.notes))
    return lines


def allreduce_main(args: argparse.Namespace) -> int:
    from layerwatch.engine.outcome import (
        EXIT_FINDING,
        EXIT_OK,
        check_report_path,
        notes_to_stderr,
        write_object_report,
    )

    check_report_path(args.output)
    dumps = list(args.dump)
    report = check_allreduce(dumps, getattr(args, "thresholds", None))
    if not report.rows:
        why = "; ".join(report.notes) or "no all_reduce nodes in the dump"
        raise LayerwatchError(f"nothing to check in {' '.join(dumps)}: {why}")
    if args.output:
        write_object_report(args.output, report.to_json(), lambda out: write_csv(report, out))
    if args.json:
        sys.stdout.write(json.dumps(report.to_json(), allow_nan=False) + "\n")
    elif not args.output:
        print("\n".join(summary_lines(report)))
    else:
        notes_to_stderr(report.notes)
    sys.stdout.flush()
    return EXIT_FINDING if report.first_failure is not None else EXIT_OK
