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
from typing import TYPE_CHECKING

from layerwatch.engine.records import PairResult, TensorKey, Topology, Verdict

if TYPE_CHECKING:
    from layerwatch.engine.seam import WeightRow

_UNKNOWN = 1 << 40
_DIGITS = re.compile(r"(\d+)")


_STEM_KEYS: dict[str, tuple[int, tuple[object, ...]]] = {}
"""Stem → (``_io``, ``stem_sort``): a run has a few hundred stems, met at every token (a report
sorts every pair by them: the split was ~1.5 µs of a pair's key, a hit ~0.1)."""
_STEM_KEYS_MAX = 1 << 16


def _stem_sort(stem: str) -> tuple[object, ...]:
    return tuple(int(p) if p.isdigit() else p for p in _DIGITS.split(stem))


def _stem_keys(stem: str) -> tuple[int, tuple[object, ...]]:
    """``(_io(stem), stem_sort(stem))``, remembered per stem string (bounded)."""
    found = _STEM_KEYS.get(stem)
    if found is None:
        if len(_STEM_KEYS) >= _STEM_KEYS_MAX:
            _STEM_KEYS.clear()
        found = _STEM_KEYS[stem] = (_io(stem), _stem_sort(stem))
    return found


def stem_sort(stem: str) -> tuple[object, ...]:
    """Sort key of a stem: numbers as numbers (``output_2`` < ``output_10``)."""
    return _stem_keys(stem)[1]


def part_of(stem: str) -> str:
    """``input``/``output`` of a stem; anything not named ``input…`` counts as an output."""
    return "input" if stem.startswith("input") else "output"


def _io(stem: str) -> int:
    return 0 if stem.startswith("input") else 1


def report_key(result: PairResult) -> tuple[object, ...]:
    key = result.key
    order = result.order if result.order >= 0 else _UNKNOWN
    io, sort = _stem_keys(key.stem)
    return (key.token, key.rank, order, key.node, io, sort)


def failure_key(result: PairResult) -> tuple[object, ...]:
    key = result.key
    order = result.order if result.order >= 0 else _UNKNOWN
    io, sort = _stem_keys(key.stem)
    return (key.token, io == 0, order, key.rank, key.node, sort)


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


def weight_rows(golden: Topology | None, target: Topology | None, node: str) -> list[WeightRow]:
    """``node``'s direct parameters on both sides (topology.json fingerprints), each marked
    whether it differs beyond a dtype cast; empty when either side has no fingerprints."""
    from layerwatch.engine.seam import WeightRow  # a drill-in's (engine/seam_detail.py)
    from layerwatch.engine.session.weightmap import prints_agree

    g = golden.nodes.get(node.split("#")[0]) if golden is not None else None
    t = target.nodes.get(node.split("#")[0]) if target is not None else None
    if g is None or t is None:
        return []
    rows = []
    for name, gp in g.params.items():
        tp = t.params.get(name)
        if tp is None:
            continue
        differ = tuple(gp.shape) != tuple(tp.shape) or not prints_agree(gp, tp)
        rows.append(
            WeightRow(
                name, tuple(gp.shape), tuple(tp.shape), gp.dtype, tp.dtype, gp.norm, tp.norm, differ
            )
        )
    return rows


def _is_shard(whole: tuple[int, ...], part: tuple[int, ...]) -> bool:
    """``part`` is ``whole`` cut along one dim into equal pieces (``engine/session/ranks.py``)."""
    if len(whole) != len(part) or whole == part:
        return False
    diff = [(a, b) for a, b in zip(whole, part, strict=True) if a != b]
    return len(diff) == 1 and diff[0][1] > 0 and diff[0][0] % diff[0][1] == 0


def weights_differ(golden: Topology | None, target: Topology | None, node: str) -> str:
    """``weights differ: weight (norm 1.23 vs 1.27)`` when ``node``'s parameter fingerprints
    (topology.json, taken at hook time) disagree beyond a dtype cast; ``""`` when they agree
    or either side has none. A failing operator with different weights is a conversion bug,
    not a kernel bug: the root cause says so.
    """
    bad = []
    for row in weight_rows(golden, target, node):
        if not row.differ:
            continue
        if _quantised(row.target_dtype) and not _quantised(row.golden_dtype):
            continue  # int8/fp8 weights never print like floats: `layerwatch weights` judges them
        if _is_shard(row.golden_shape, row.target_shape):
            continue  # a tensor-parallel rank holds a slice: its fingerprint cannot match the whole
        if row.golden_shape != row.target_shape:
            bad.append(f"{row.name} (shape {list(row.golden_shape)} vs {list(row.target_shape)})")
        else:
            bad.append(f"{row.name} (norm {row.golden_norm:.6g} vs {row.target_norm:.6g})")
    return f"weights differ: {', '.join(bad)}" if bad else ""
