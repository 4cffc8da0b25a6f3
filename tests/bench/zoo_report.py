"""Benign-run figures of the Hugging Face zoo (``tests/support/hf_zoo.py``) under ``layerwatch compare``.

For every architecture × target dtype × {random, trained} weights: the fp32 eager golden, the
target forced onto the golden's ids, compared by compare's own code; prints the verdict counts,
the worst cosine (and where) and the worst relative Euclidean distance (RED) of each operator
type's outputs. Threshold calibration reads these to see what benign rounding looks like.

Run::

    OMP_NUM_THREADS=1 python tests/bench/zoo_report.py                    # 5 archs × bf16,fp16 × both
    ... --archs llama,gpt2 --dtypes bf16 --weights trained --tokens 8
    ... --attn sdpa --dtypes fp32     # the other attention kernel in fp32
    ... --json zoo.json               # every figure, machine-readable
    ... --faults                      # each fault: its size at its node, found by compare?

Trained weights are trained once per arch (≈40 s of one core each) and cached
(``$LAYERWATCH_TEST_CACHE``); captures are cached under ``--runs`` (default: ``runs/`` in the
same cache), so a second report only compares.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import hf_zoo, lwdump

COS, RED = "cosine_similarity", "relative_euclidean_distance"


def op_types(run: Path) -> dict[str, str]:
    """Node → module class name, from the dump's own index."""
    return {ln["node"]: ln["type"] for ln in lwdump.index(run) if ln["k"] == "t"}


def figures(golden: Path, target: Path) -> dict[str, Any]:
    """Verdict counts, worst cosine and worst RED per operator type (outputs only) of one pair."""
    code, report = hf_zoo.compare_json(golden, target)
    types = op_types(target)
    rows = [
        r
        for r in report["rows"]
        if r["tensor"].startswith("output") and r["metrics"].get(COS) is not None
    ]
    worst = min(rows, key=lambda r: r["metrics"][COS])
    by_type: dict[str, dict[str, Any]] = {}
    for row in rows:
        kind = types.get(row["node"], "?")
        red = row["metrics"].get(RED)
        if red is None:
            continue
        if kind not in by_type or red > by_type[kind]["red"]:
            by_type[kind] = {"red": red, "token": row["token"], "node": row["node"]}
    first = report["first_failure"]
    return {
        "exit": code,
        "summary": report["summary"],
        "first_failure": None if first is None else f"{first['token']}:{first['node']}",
        "worst_cos": worst["metrics"][COS],
        "worst_cos_at": f"{worst['token']}:{worst['node']}:{worst['tensor']}",
        "worst_red_by_type": by_type,
    }


def fault_figures(golden: Path, target: Path, fault: hf_zoo.Fault) -> dict[str, Any]:
    """The fault's size at its own output (from its token on) and what compare says first."""
    code, report = hf_zoo.compare_json(golden, target)
    at = [
        r
        for r in report["rows"]
        if r["node"] == fault.node and r["tensor"] == "output" and r["token"] >= fault.from_token
    ]
    first = report["first_failure"]
    return {
        "exit": code,
        "max_red": max(r["metrics"][RED] for r in at),
        "min_cos": min(r["metrics"][COS] for r in at),
        "first_failure": None if first is None else f"{first['token']}:{first['node']}",
        "found_at_node": first is not None
        and (first["token"], first["node"]) == (fault.from_token, fault.node),
    }


def fault_report(args: argparse.Namespace, runs: Path) -> list[dict[str, Any]]:
    results = []
    for arch in args.archs.split(","):
        for weights in args.weights.split(","):
            for fault in hf_zoo.faults_for(arch):
                line = f"{arch:8} {weights:7} {fault.name:15} {fault.kind:6}"
                for dtype in ["fp32", *args.dtypes.split(",")]:
                    golden, target = hf_zoo.golden_and_target(
                        arch,
                        runs,
                        dtype=dtype,
                        fault=fault.name,
                        trained=weights == "trained",
                        new_tokens=args.tokens,
                    )
                    fig = fault_figures(golden, target, fault)
                    fig.update(arch=arch, weights=weights, dtype=dtype, fault=fault.name)
                    results.append(fig)
                    mark = "found" if fig["found_at_node"] else (fig["first_failure"] or "pass")
                    line += f" | {dtype} RED {fig['max_red']:.4f} cos {fig['min_cos']:.5f} {mark}"
                print(line, flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default=",".join(hf_zoo.ARCHS))
    parser.add_argument("--dtypes", default="bf16,fp16")
    parser.add_argument("--weights", default="random,trained")
    parser.add_argument("--attn", default="eager", help="target attention (golden: eager)")
    parser.add_argument("--tokens", type=int, default=8, help="decode steps after the prefill")
    parser.add_argument("--runs", type=Path, default=None, help="capture cache directory")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here")
    parser.add_argument(
        "--faults",
        action="store_true",
        help="instead: each fault's size at its node (fp32 and each dtype) and compare's verdict",
    )
    args = parser.parse_args(argv)
    runs = args.runs or hf_zoo.cache_dir() / "runs"
    if args.faults:
        results = fault_report(args, runs)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
        return 0
    results = []
    for arch in args.archs.split(","):
        for weights in args.weights.split(","):
            for dtype in args.dtypes.split(","):
                golden, target = hf_zoo.golden_and_target(
                    arch,
                    runs,
                    dtype=dtype,
                    attn=args.attn,
                    trained=weights == "trained",
                    new_tokens=args.tokens,
                )
                fig = figures(golden, target)
                fig.update(arch=arch, weights=weights, dtype=dtype, attn=args.attn)
                results.append(fig)
                s = fig["summary"]
                print(
                    f"{arch:8} {weights:7} {dtype:4} {args.attn:5} pass {s['pass']:4} "
                    f"fail {s['fail']:3}  worst cos {fig['worst_cos']:.6f} (1-cos {1 - fig['worst_cos']:.1e}) at "
                    f"{fig['worst_cos_at'].replace('root.', '')}"
                    + (f"  first failure {fig['first_failure']}" if fig["first_failure"] else "")
                )
                reds = sorted(fig["worst_red_by_type"].items(), key=lambda kv: -kv[1]["red"])
                print(
                    "    worst RED: " + ", ".join(f"{kind} {v['red']:.4f}" for kind, v in reds),
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
