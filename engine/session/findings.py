"""The session's rules for ordering results and locating the first failure and the root cause.

- Report order: token, then execution order (completion order: inner operators before their
  parents), then a node's inputs before its outputs, then the stem (``output_2`` < ``output_10``).
- First failure (FAIL or ERROR, never DIVERGED): the earliest token; inside it outputs decide —
  the first failing *output* in execution order, and only when no output fails at that token the
  first failing input. So the innermost failing operator comes first.
- Root cause: the first failing output, in the same order, whose captured inputs all pass. When a
  node's inputs were not captured (msit never sees keyword inputs; ``--part out``) nothing
  contradicts it: it qualifies and the finding says its inputs are unknown. Execution order makes
  that a good guess: every output that finished before it passes.
- First bad token: the earliest token whose logits pair fails; the earliest token with any
  failure when no logits were captured.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from layerwatch.engine.records import PairResult, TensorKey, Topology, Verdict

_UNKNOWN = 1 << 40
_DIGITS = re.compile(r"(\d+)")


def stem_sort(stem: str) -> tuple[object, ...]:
    return tuple(int(p) if p.isdigit() else p for p in _DIGITS.split(stem))


def part_of(stem: str) -> str:
    """``input``/``output`` of a stem; anything not named ``input…`` counts as an output."""
    return "input" if stem.startswith("input") else "output"


def _io(stem: str) -> int:
    return 0 if stem.startswith("input") else 1


def report_key(result: PairResult) -> tuple[object, ...]:
    key = result.key
    order = result.order if result.order >= 0 else _UNKNOWN
    return (key.token, key.rank, order, key.node, _io(key.stem), stem_sort(key.stem))


def failure_key(result: PairResult) -> tuple[object, ...]:
    key = result.key
    order = result.order if result.order >= 0 else _UNKNOWN
    return (key.token, _io(key.stem) == 0, order, key.rank, key.node, stem_sort(key.stem))


def first_failure(failures: Iterable[PairResult]) -> PairResult | None:
    return min(failures, key=failure_key, default=None)


def root_cause(
    failures: Iterable[PairResult], inputs_of: Callable[[TensorKey], list[PairResult | None]]
) -> tuple[PairResult, bool] | None:
    """The root-cause pair and whether its inputs were captured (see the module docstring).

    ``inputs_of`` returns the node's input pairs at that token; ``None`` entries are inputs not
    compared yet, which keep the node from qualifying until they are.
    """
    for result in sorted((r for r in failures if _io(r.key.stem) == 1), key=failure_key):
        inputs = inputs_of(result.key)
        if any(r is None or r.verdict is not Verdict.PASS for r in inputs):
            continue
        return result, bool(inputs)
    return None


def _quantised(dtype: str) -> bool:
    return dtype.removeprefix("torch.") in ("int8", "uint8", "int4") or "float8" in dtype


def weights_differ(golden: Topology | None, target: Topology | None, node: str) -> str:
    """``weights differ: weight (norm 1.23 vs 1.27)`` when ``node``'s parameter fingerprints
    (topology.json, taken at hook time) disagree beyond a dtype cast; ``""`` when they agree
    or either side has none. A failing operator with different weights is a conversion bug,
    not a kernel bug: the root cause says so.
    """
    from layerwatch.engine.session.weightmap import prints_agree

    g = golden.nodes.get(node) if golden is not None else None
    t = target.nodes.get(node) if target is not None else None
    if g is None or t is None:
        return ""
    bad = []
    for name, gp in g.params.items():
        tp = t.params.get(name)
        if tp is None:
            continue
        if _quantised(tp.dtype) and not _quantised(gp.dtype):
            continue  # int8/fp8 weights never print like floats: `layerwatch weights` judges them
        if gp.shape != tp.shape:
            bad.append(f"{name} (shape {list(gp.shape)} vs {list(tp.shape)})")
        elif not prints_agree(gp, tp):
            bad.append(f"{name} (norm {gp.norm:.6g} vs {tp.norm:.6g})")
    return f"weights differ: {', '.join(bad)}" if bad else ""
