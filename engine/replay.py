"""``layerwatch precheck --replay -- CMD``: operator precheck without a dump (msit's API precheck).

The command runs under the capture bootstrap with engine/replay_child.py as its in-process part:
during the run only statistics of each supported operator's inputs are kept (no tensors); at
exit each distinct (operator, shape, dtype) is re-run in that process, on its device, on random
inputs drawn to match the recorded ranges, and judged against the float64 reference of
engine/numerics/precheck.py. This module launches the command, reads the ``replay_{pid}.json``
files it left and reports them in ``layerwatch precheck``'s JSON shape (engine/precheck.py's
:class:`PrecheckReport`), each row with the replayed ``shape``, ``dtype``, ``calls``,
``ranges`` and ``class``, plus a ``replay`` object (``processes``, ``calls``, ``distinct``,
``bytes``: what the run left on disk, and the command's ``exit_code``).

Exit codes: 0 every replayed operator within its bound, 1 one deviates (or cannot be replayed,
or the command failed), 2 the command could not run or left no results.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.numerics import precheck as ref
from layerwatch.engine.records import PairResult, TensorKey, Verdict
from layerwatch.engine.wording import note_lines

ENTRY = "layerwatch.engine.replay_child:install"
EXIT_OK, EXIT_FINDING = 0, 1
_VERDICTS = {"pass": Verdict.PASS, "fail": Verdict.FAIL, "error": Verdict.ERROR}
_EXTRA = ("class", "shape", "dtype", "calls", "ranges")


def read_results(out: Path) -> tuple[Any, list[dict[str, Any]], dict[str, Any]]:
    """The child files under ``out`` as a :class:`PrecheckReport`, the extra fields of each of
    its rows (same order), and the run's ``replay`` figures."""
    from layerwatch.engine.precheck import PrecheckReport
    from layerwatch.engine.replay_child import FORMAT, RESULT_GLOB

    report = PrecheckReport()
    extras: list[dict[str, Any]] = []
    files = sorted(out.glob(RESULT_GLOB))
    calls = 0
    for rank, path in enumerate(files):
        try:
            body = json.loads(path.read_text(encoding="utf-8"))
            if body.get("format") != FORMAT:
                raise ValueError("not a replay result")
            rows = list(body["rows"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            report.notes.append(f"{path.name}: unreadable ({exc})")
            continue
        calls += int(body.get("calls", 0))
        for name, count in dict(body.get("unsupported", {})).items():
            report.unsupported[str(name)] += int(count)
        for row in rows:
            metrics = {
                k: (float("nan") if v is None else float(v)) for k, v in row["metrics"].items()
            }
            limits = ((ref.ELEMENT_RATIO, ref.ELEMENT_LIMIT), (ref.NORM_RATIO, ref.NORM_LIMIT))
            result = PairResult(
                TensorKey(int(row["token"]), str(row["node"]), "output", rank),
                _VERDICTS.get(str(row["verdict"]), Verdict.ERROR),
                metrics=metrics,
                failed=tuple(n for n, limit in limits if metrics.get(n, 0.0) > limit),
                reason=str(row.get("reason", "")),
                node_type=str(row.get("type", "")),
            )
            report.rows.append(result)
            extras.append({k: row.get(k) for k in _EXTRA})
    figures = {
        "processes": len(files),
        "calls": calls,
        "distinct": len(report.rows),
        "bytes": sum(
            p.stat().st_size for p in out.rglob("*") if p.is_file() and p.suffix == ".json"
        ),
    }
    return report, extras, figures


def replay_object(
    report: Any, extras: list[dict[str, Any]], figures: dict[str, Any]
) -> dict[str, Any]:
    """``layerwatch precheck``'s JSON object with the replay's fields added."""
    obj = report.to_json()
    for row, extra in zip(obj["rows"], extras, strict=True):
        row.update(extra)
    obj["replay"] = figures
    return obj


def replay_main(args: Any) -> int:
    """The ``precheck --replay`` command (see the module docstring)."""
    from layerwatch.capture.dumpcmd import supervise
    from layerwatch.capture.launch import CaptureOptions, Child, LaunchSpec
    from layerwatch.engine.outcome import check_report_path, write_object_report
    from layerwatch.engine.precheck import summary_line, write_csv

    output = getattr(args, "output", None)
    check_report_path(output)
    cmd = ([args.dump] if getattr(args, "dump", None) else []) + list(
        getattr(args, "cmd", []) or []
    )
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise LayerwatchError(
            "no command given: layerwatch precheck --replay -- python infer.py ..."
        )
    keep = getattr(args, "out", None)
    out = Path(keep).absolute() if keep else Path(tempfile.mkdtemp(prefix="layerwatch-replay-"))
    if keep and out.is_dir() and any(out.glob("replay_*.json")):
        raise LayerwatchError(f"{out} already holds replay results: give an empty folder")
    spec = LaunchSpec(
        cmd=cmd, out=out, options=CaptureOptions(seed=getattr(args, "seed", None), entry=ENTRY)
    )
    child = Child(spec)
    try:
        child.start()
        code = supervise(child)
        report, extras, figures = read_results(out)
        figures["exit_code"] = code
        if not report.rows:
            tail = [t for t in child.log_tail(6) if t.strip()]
            why = (f"the command exited with {code}" if code else "no supported operator ran") + (
                f": {tail[-1].strip()}" if tail else ""
            )
            raise LayerwatchError(
                f"nothing replayed ({why}); it must run a torch model in Python, without -I/-S"
            )
        if code != 0:
            report.notes.append(f"the command exited with {code} (its output: {spec.log_path})")
        obj = replay_object(report, extras, figures)
        if output:
            write_object_report(output, obj, lambda fh: write_csv(report.rows, fh))
        if getattr(args, "json", False):
            sys.stdout.write(json.dumps(obj) + "\n")
        else:
            sys.stdout.write(
                summary_line(report).replace("precheck:", "precheck --replay:", 1)
                + f"\nreplayed {figures['distinct']} distinct operators of {figures['calls']} calls;"
                f" {figures['bytes']} bytes on disk\n"
            )
            for row in report.failed:
                sys.stdout.write(f"FAIL {row.key.node} ({row.node_type}): {row.reason}\n")
            sys.stdout.write("".join(line + "\n" for line in note_lines(report.notes)))
    finally:
        if not keep:
            shutil.rmtree(out, ignore_errors=True)
    return EXIT_FINDING if report.failed or report.errors or code != 0 else EXIT_OK
