"""``layerwatch compare GOLDEN TARGET --fake-quant FQ``: where a quantised model's error comes from.

Three dumps of the same prompt: the float ``GOLDEN``, a *fake-quant* run ``FQ`` (the quantised
weights dequantised and run with float kernels) and the real-quant ``TARGET``. Two ordinary
comparisons split the error of every tensor in two parts:

* ``quantisation`` = golden vs fake-quant: what quantising the weights costs by itself — the
  quantisation scheme's error, present in any correct implementation;
* ``kernel`` = fake-quant vs target: what the quantised kernels add on top — a wrong scale, a
  bad int8 GEMM, a mis-laid tensor. This is the part that says the port is broken.

Each row is a target tensor with both parts; its verdict, the summary, ``first_failure`` and
``root_cause`` (and so the exit code) are the kernel part's, because the quantisation error is
expected and must not be blamed on a kernel. A quantised kernel rounds in another order than
the fake-quant float kernel, so the kernel part allows linears :data:`QUANT_KERNEL_RED` more
local noise (:func:`kernel_thresholds`). The grid colours by the kernel part as well:
:func:`kernel_sides` tells a front end which two dumps to open. Both comparisons are
engine/session/core.py's ``CompareSession`` under the same thresholds.

JSON: compare's object (engine/report.py) whose rows carry ``"kernel"`` and ``"quantisation"``
(each ``{"verdict", "metrics", "reason"}``; ``null`` when that part has no pair) and
``"cause"`` (``kernel`` | ``quantisation`` | ``none``), plus ``summary.quantisation`` (the
golden-vs-fake-quant counts) and ``quantisation_first_failure``. CSV: compare's columns plus
``quant_verdict``, ``quant_cosine_similarity``, ``quant_relative_euclidean_distance``,
``quant_reason``, ``cause``.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.records import PairResult, TensorKey, Verdict

QUANT_COLUMNS = (
    "quant_verdict",
    "quant_cosine_similarity",
    "quant_relative_euclidean_distance",
    "quant_reason",
    "cause",
)
KERNEL, QUANTISATION, NONE = "kernel", "quantisation", "none"
QUANT_KERNEL_RED = 4.0
"""Extra noise allowance (units of ``u``) of a linear's local verdict in the kernel part: a
quantised GEMM sums exact integer products and scales after, while the fake-quant run rounds
each dequantised weight ``q · s`` first — the same maths, rounded in another order. Measured
on tests/engine/test_quantcmp.py's simulated int8 kernel: worst benign 2.8 u (fp32 limit
1.34 u); the weakest fault there (3 channels' scale × 1.04) is 10⁵ times the limit."""


def kernel_sides(golden: str, target: str, fake_quant: str | None) -> tuple[str, str]:
    """The two dumps whose comparison colours the grid: fake-quant vs target when a fake-quant
    dump is given (the kernel part), else golden vs target."""
    return (fake_quant, target) if fake_quant else (golden, target)


def kernel_args(args: argparse.Namespace) -> argparse.Namespace:
    """A front end's arguments turned to the kernel part: fake-quant as the golden side, the
    kernel part's thresholds (the TUI then only reads an ordinary comparison)."""
    golden, target = kernel_sides(args.golden, args.target, args.fake_quant)
    if not Path(golden).exists():
        raise LayerwatchError(f"fake-quant dump {golden}: no such file or directory")
    thresholds = kernel_thresholds(getattr(args, "thresholds", None))
    return argparse.Namespace(
        **{**vars(args), "golden": golden, "target": target, "thresholds": thresholds}
    )


class QuantisationLine:
    """An ``operator_check`` for the kernel part's session (engine/session/core.py): the
    operator view of a fake-quant-vs-target pair also says how the same tensor fared between
    golden and fake-quant, then whatever check it wraps (the op's own precheck). The golden
    and fake-quant dumps are indexed on first use (a drill-down runs in a worker thread)."""

    def __init__(
        self, golden: str, fake_quant: str, thresholds: Any, then: Callable[..., str] | None
    ) -> None:
        self.paths = (golden, fake_quant)
        self.thresholds = thresholds
        self.then = then
        self._sides: tuple[dict[Any, Any], dict[Any, Any]] | None = None

    def _records(self) -> tuple[dict[Any, Any], dict[Any, Any]]:
        if self._sides is None:
            from layerwatch.engine.readers import open_dump

            golden, fq = (
                {_ident(r.key): r for r in open_dump(p, side=s).poll(None, final=True).tensors}
                for p, s in zip(self.paths, ("golden", "target"), strict=True)
            )
            self._sides = (golden, fq)
        return self._sides

    def __call__(self, target: Any, records: Any, topology: Any, weights: Any) -> str:
        from layerwatch.engine.numerics.compare import compare_pair
        from layerwatch.engine.numerics.thresholds import Thresholds

        golden, fq = self._records()
        ident = _ident(target.key)
        line = ""
        if ident in golden and ident in fq:
            thresholds = self.thresholds
            if not isinstance(thresholds, Thresholds):
                thresholds = Thresholds.load(thresholds)
            r = compare_pair(golden[ident], fq[ident], thresholds)
            m = r.metrics
            line = (
                f"quantisation part (golden vs fake-quant): {r.verdict.value}"
                f" · cos {m.get('cosine_similarity', float('nan')):.6f}"
                f" · RED {m.get('relative_euclidean_distance', float('nan')):.3g}"
            )
        rest = self.then(target, records, topology, weights) if self.then else ""
        return " · ".join(part for part in (line, rest) if part)


@dataclass(slots=True)
class QuantRow:
    """One target tensor: its kernel part (fake-quant vs target) and quantisation part."""

    kernel: PairResult
    quantisation: PairResult | None

    @property
    def cause(self) -> str:
        if self.kernel.verdict in (Verdict.FAIL, Verdict.ERROR):
            return KERNEL
        if self.quantisation is not None and self.quantisation.verdict is Verdict.FAIL:
            return QUANTISATION
        return NONE

    def to_json(self) -> dict[str, Any]:
        from layerwatch.engine.floattext import finite

        row = self.kernel.to_json()
        row["metrics"] = finite(self.kernel.metrics)
        row["kernel"] = _part(self.kernel)
        row["quantisation"] = None if self.quantisation is None else _part(self.quantisation)
        row["cause"] = self.cause
        return row


def _part(result: PairResult) -> dict[str, Any]:
    from layerwatch.engine.floattext import finite

    return {
        "verdict": result.verdict.value,
        "metrics": finite(result.metrics),
        "reason": result.reason,
    }


def kernel_thresholds(path: str | None) -> Any:
    """The thresholds of the kernel part: the user's (or the packaged) ones, each linear's
    local noise allowance raised by :data:`QUANT_KERNEL_RED`."""
    import dataclasses

    from layerwatch.engine.numerics.thresholds import Thresholds

    thresholds = Thresholds.load(path)
    for table in thresholds.local.values():
        if "linear" in table:
            limit = table["linear"]
            table["linear"] = dataclasses.replace(limit, red=limit.red + QUANT_KERNEL_RED)
    return thresholds


def _golden(path: str) -> Any:
    from layerwatch.engine.readers import open_dump

    return open_dump(path, side="golden").poll(None, final=True)


def _ident(key: TensorKey) -> tuple[int, str, str, int]:
    return (key.token, key.node, key.stem, key.rank)


@dataclass(slots=True)
class QuantCompare:
    """The two finished sessions and the rows joined by tensor."""

    quantisation: Any
    """``CompareSession`` golden vs fake-quant."""
    kernel: Any
    """``CompareSession`` fake-quant vs target (the verdict)."""
    rows: list[QuantRow]

    def to_json(self) -> dict[str, Any]:
        from layerwatch.engine.report import _finding, json_report

        k = self.kernel
        obj = json_report(
            [r.kernel for r in self.rows],
            k.summary,
            k.first_failure,
            k.root_cause,
            k.first_bad_token,
            getattr(k, "divergence", None),
        )
        obj["summary"]["quantisation"] = self.quantisation.summary.to_json()
        obj["quantisation_first_failure"] = _finding(self.quantisation.first_failure)
        obj["rows"] = [r.to_json() for r in self.rows]
        return obj

    def write_csv(self, out: TextIO) -> None:
        from layerwatch.engine.report import CSV_COLUMNS, csv_row

        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(CSV_COLUMNS + QUANT_COLUMNS)
        for i, row in enumerate(self.rows):
            q = row.quantisation
            extra = ["", "", "", ""]
            if q is not None:
                m = q.metrics
                extra = [
                    q.verdict.value,
                    _num(m.get("cosine_similarity")),
                    _num(m.get("relative_euclidean_distance")),
                    q.reason,
                ]
            writer.writerow(csv_row(row.kernel, i) + extra + [row.cause])

    def summary_text(self) -> str:
        from layerwatch.engine.wording import finding_words, summary_text

        q = self.quantisation
        first = q.first_failure
        where = finding_words(first, q.blocks()) if first is not None else "none"
        s = q.summary
        return "\n".join(
            [
                "kernel part (fake-quant vs target), the verdict:",
                summary_text(self.kernel),
                "quantisation part (golden vs fake-quant), expected error, not a verdict:",
                f"pairs: {s.pairs} compared · {s.passed} within the float limits · "
                f"{s.failed} outside · first outside: {where}",
            ]
        )


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"


def join_rows(quantisation: Any, kernel: Any) -> list[QuantRow]:
    """Kernel rows in report order, each with the quantisation row of the same tensor (the
    fake-quant tensor is the target of one comparison and the golden of the other)."""
    by_tensor: dict[tuple[int, str, str, int], PairResult] = {}
    for result in quantisation.results():
        key = result.target.key if result.target is not None else result.key
        by_tensor[_ident(key)] = result
    return [QuantRow(r, by_tensor.get(_ident(r.key))) for r in kernel.results()]


def run_quant_compare(
    golden: str,
    fake_quant: str,
    target: str,
    make_session: Callable[[Any], Any],
    thresholds: str | None = None,
) -> QuantCompare:
    """Read the three dumps, run both comparisons to the end, join their rows."""
    from layerwatch.engine.readers import open_dump

    for side, path in (("golden", golden), ("fake-quant", fake_quant), ("target", target)):
        if not Path(path).exists():
            raise LayerwatchError(f"{side} dump {path}: no such file or directory")
    from layerwatch.engine.cases import has_cases

    updates = {
        path: open_dump(path, side="target").poll(None, final=True)
        for path in dict.fromkeys((golden, fake_quant, target))
    }
    if has_cases(*updates.values()):
        raise LayerwatchError(
            "--fake-quant compares one prompt: these dumps hold several cases (capture one with"
            " `dump --cases`)"
        )
    sessions = []
    parts = ((golden, fake_quant, thresholds), (fake_quant, target, kernel_thresholds(thresholds)))
    for left, right, limits in parts:
        session = make_session(limits)
        try:
            session.compare_finished(_golden(left), updates[right])
        finally:
            session.close()
        if not session.results():
            raise LayerwatchError(f"nothing to compare: no tensors pair between {left} and {right}")
        sessions.append(session)
    quantisation, kernel = sessions
    return QuantCompare(quantisation, kernel, join_rows(quantisation, kernel))


def quant_compare_main(args: argparse.Namespace, make_session: Callable[[Any], Any]) -> int:
    """``compare --fake-quant``: the report, stdout and exit code by engine/outcome.py's rules."""
    from layerwatch.engine.outcome import (
        check_report_path,
        exit_code,
        mismatch,
        write_object_report,
    )
    from layerwatch.engine.report import dumps_json

    output = getattr(args, "output", None)
    check_report_path(output)
    result = run_quant_compare(
        args.golden,
        args.fake_quant,
        args.target,
        make_session,
        getattr(args, "thresholds", None),
    )
    obj = result.to_json()
    if output:
        write_object_report(output, obj, result.write_csv)
    if getattr(args, "json", False):
        sys.stdout.write(dumps_json(obj) + "\n")
    elif not output:
        sys.stdout.write(result.summary_text() + "\n")
    sys.stdout.flush()
    allow = bool(getattr(args, "allow_partial", False))
    for session in (result.quantisation, result.kernel):
        wrong = mismatch(session, allow_partial=allow)
        if wrong is not None:
            raise LayerwatchError(wrong)
    return exit_code(result.kernel.summary)
