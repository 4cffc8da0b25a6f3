"""Calibrate the local-verdict limits (``[local.*]`` in engine/thresholds.toml) and check them.

    OMP_NUM_THREADS=1 python tests/bench/calibrate_local.py            # print the table
    OMP_NUM_THREADS=1 python tests/bench/calibrate_local.py --write    # and rewrite the TOML

Benign runs: every arch of tests/support/hf_zoo.py with random and trained weights, as bf16,
fp16 and fp32-sdpa targets against the fp32-eager golden (teacher-forced). For every output of
a leaf operator: the noise excess (RED_out − 2·RED_in)/u and the scale excess
(NRE_out − gain·NRE_in)/u, u the dtype's unit roundoff (engine/numerics/local.py). A limit is
max(1, 1.5 × the worst benign excess + 0.5). Then every fault of the zoo (both dtypes, both
weight kinds) is compared with those limits: the first failure should be the fault's exact
(token, node). Captures are cached (``--runs``), so a second run only compares.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from layerwatch.engine.numerics.local import UNIT_ROUNDOFF, op_kind
from layerwatch.engine.records import NORM_REL, RED
from support import hf_zoo, lwdump

LEAVES = ("linear", "norm", "activation", "embedding", "dropout")
RED_GAIN = 2.0
SCALE_GAIN = {"norm": 1.0}  # a norm removes its input's scale: its own scale error is 1:1
MARGIN, SLACK = 1.5, 0.5
TOML = Path(__file__).resolve().parents[2] / "engine" / "thresholds.toml"


def outputs(golden: Path, target: Path) -> list[dict[str, Any]]:
    """Leaf-operator outputs with their largest input errors (compare's own rows)."""
    _, report = hf_zoo.compare_json(golden, target)
    types = {ln["node"]: ln["type"] for ln in lwdump.index(target) if ln["k"] == "t"}
    nodes: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for row in report["rows"]:
        nodes[(row["token"], row["node"])].append(row)
    out = []
    for (token, node), rows in nodes.items():
        kind = op_kind(types.get(node, ""))
        if kind not in LEAVES:
            continue
        ins = [
            r["metrics"] for r in rows if r["tensor"].startswith("input") and RED in r["metrics"]
        ]
        if not ins and kind != "embedding":
            continue
        for r in rows:
            if r["tensor"].startswith("output") and RED in r["metrics"]:
                out.append(
                    dict(
                        token=token,
                        node=node,
                        kind=kind,
                        red=r["metrics"][RED],
                        nre=r["metrics"][NORM_REL],
                        red_in=max((m[RED] for m in ins), default=0.0),
                        nre_in=max((m[NORM_REL] for m in ins), default=0.0),
                        verdict=r["verdict"],
                        failed=r.get("failed_metrics", []),
                    )
                )
    return out


def excess(row: dict[str, Any], klass: str) -> tuple[float, float]:
    u = UNIT_ROUNDOFF[klass]
    gain = SCALE_GAIN.get(row["kind"], 2.0)
    return (row["red"] - RED_GAIN * row["red_in"]) / u, (row["nre"] - gain * row["nre_in"]) / u


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=hf_zoo.cache_dir() / "calibrate-local")
    parser.add_argument("--write", action="store_true", help="rewrite [local.*] in thresholds.toml")
    args = parser.parse_args()
    worst: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for arch in hf_zoo.ARCHS:
        for trained in (False, True):
            for dtype, attn in (("bf16", "eager"), ("fp16", "eager"), ("fp32", "sdpa")):
                golden, target = hf_zoo.golden_and_target(
                    arch, args.runs, dtype=dtype, attn=attn, trained=trained
                )
                for row in outputs(golden, target):
                    w = worst[(dtype, row["kind"])]
                    noise, scale = excess(row, dtype)
                    w[0], w[1] = max(w[0], noise), max(w[1], scale)
        print(f"[calibrate] {arch}: benign runs measured", file=sys.stderr)
    limits = {
        key: tuple(math.ceil(max(1.0, MARGIN * w + SLACK) * 100) / 100 for w in pair)
        for key, pair in worst.items()
    }
    print("class kind        worst noise/scale (u)  →  limits")
    for (klass, kind), (noise, scale) in sorted(worst.items()):
        lim = limits[(klass, kind)]
        print(f"{klass:5s} {kind:11s} {noise:7.2f} {scale:7.2f}  →  {lim[0]:6.2f} {lim[1]:6.2f}")
    found = missed = 0
    for arch in hf_zoo.ARCHS:
        for trained in (False, True):
            for fault in hf_zoo.faults_for(arch):
                for dtype in ("bf16", "fp16"):
                    golden, target = hf_zoo.golden_and_target(
                        arch, args.runs, dtype=dtype, fault=fault.name, trained=trained
                    )
                    _, report = hf_zoo.compare_json(golden, target)
                    first = report["first_failure"]
                    where = None if first is None else (first["token"], first["node"])
                    if where == (fault.from_token, fault.node):
                        found += 1
                    else:
                        missed += 1
                        weights = "trained" if trained else "random"
                        print(
                            f"  fault {fault.name} {arch} {dtype} {weights}: first failure {where}"
                        )
    print(f"faults first at their exact (token, node): {found}; elsewhere or later: {missed}")
    print("(the fault check uses the limits in thresholds.toml; after --write, run it again)")
    if args.write:
        write(limits)


def write(limits: dict[tuple[str, str], tuple[float, float]]) -> None:
    text = TOML.read_text(encoding="utf-8")
    lines = []
    for klass in ("fp32", "fp16", "bf16"):
        lines.append(f"[local.{klass}]")
        for kind in LEAVES:
            red, scale = limits.get((klass, kind), (1.0, 1.0))
            gain = SCALE_GAIN.get(kind, 2.0)
            lines.append(
                f"{kind} = {{ red_gain = {RED_GAIN}, red = {red}, scale_gain = {gain}, scale = {scale} }}"
            )
        lines.append("")
    section = "\n".join(lines)
    table = r"\[local\.fp32\].*?(?=\n\[(?!local\.)|\Z)"  # up to the next non-local table
    new, n = re.subn(table, section.rstrip("\n"), text, flags=re.S)
    if n != 1:
        raise SystemExit("thresholds.toml has no [local.fp32] table to replace")
    TOML.write_text(new, encoding="utf-8")
    print(f"wrote {TOML}")


if __name__ == "__main__":
    main()
