"""Calibrate ``layerwatch precheck``'s limits: worst benign figures and smallest fault figures.

    OMP_NUM_THREADS=1 python tests/bench/precheck_calibrate.py [--quick]

Captures benign dumps of the zoo's architectures (``tests/support/hf_zoo.py``) in bf16, fp16
and fp32, with random and trained weights, and every kernel fault in bf16 and fp16; prints the
worst benign element/norm ratio per op type and, per fault, the figure at the faulty node. The
limits in ``engine/numerics/precheck.py`` must sit between the two with a margin (README).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from layerwatch.engine.numerics import precheck as ref
from layerwatch.engine.precheck import precheck
from support import hf_zoo

KERNEL_FAULTS = ("kernel_scale", "kernel_eps", "gemma_plus_one", "embedding_shift")


def main() -> None:
    quick = "--quick" in sys.argv
    archs = hf_zoo.ARCHS[:2] if quick else hf_zoo.ARCHS
    worst: dict[str, tuple[float, float, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        n = 0
        for arch in archs:
            for trained in (False,) if quick else (False, True):
                for dtype in ("bf16", "fp16", "fp32"):
                    n += 1
                    dump = hf_zoo.capture(
                        arch, Path(tmp) / f"b{n}", dtype=dtype, trained=trained, dump_weight=True
                    )
                    report = precheck(dump)
                    for row in report.rows:
                        e = row.metrics.get(ref.ELEMENT_RATIO, 0.0)
                        m = row.metrics.get(ref.NORM_RATIO, 0.0)
                        old = worst.get(row.node_type, (0.0, 0.0, ""))
                        where = f"{arch}/{dtype}/{'trained' if trained else 'random'}"
                        worst[row.node_type] = (max(old[0], e), max(old[1], m), where)
                    bad = [f"{r.key.token}:{r.key.node}" for r in report.failed]
                    print(
                        f"benign {arch} {dtype} trained={trained}: {report.checked} checked, "
                        f"{len(report.failed)} failed {bad[:3]} unsupported={dict(report.unsupported)}"
                    )
        print("worst benign ratios per op type (element, norm):")
        for kind, (e, m, where) in sorted(worst.items()):
            print(f"  {kind:28s} element {e:6.3f}  norm {m:7.3f}  ({where})")
        for arch in archs:
            for fault in KERNEL_FAULTS:
                if fault == "gemma_plus_one" and arch != "gemma":
                    continue
                spec = hf_zoo.FAULTS[fault](arch)
                for dtype in ("bf16", "fp16"):
                    n += 1
                    dump = hf_zoo.capture(
                        arch, Path(tmp) / f"f{n}", dtype=dtype, fault=fault, dump_weight=True
                    )
                    report = precheck(dump)
                    first = report.first_failure
                    at = [
                        r
                        for r in report.rows
                        if r.key.node == spec.node and r.key.token >= spec.from_token
                    ]
                    fig = max((r.metrics.get(ref.PRECHECK_RATIO, 0.0) for r in at), default=0.0)
                    e = max((r.metrics.get(ref.ELEMENT_RATIO, 0.0) for r in at), default=0.0)
                    m = max((r.metrics.get(ref.NORM_RATIO, 0.0) for r in at), default=0.0)
                    ok = first is not None and (first.key.token, first.key.node) == (
                        spec.from_token,
                        spec.node,
                    )
                    got = None if first is None else (first.key.token, first.key.node)
                    print(
                        f"fault {arch} {fault} {dtype}: found={ok} first={got} ratio {fig:.2f} "
                        f"(element {e:.2f}, norm {m:.2f})"
                    )


if __name__ == "__main__":
    main()
