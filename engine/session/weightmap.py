"""Pair modules of two implementations of one model by their weights (``--auto-map``).

A Hugging Face ``LlamaForCausalLM`` and a Meta-style ``Transformer`` carrying the same weights
share no module names and no class names, but every ``Linear``/``Embedding``/norm holds the same
numbers (up to a dtype cast). Steps:

1. Fingerprints (:class:`~.records.ParamPrint`, from the topology, or computed from dumped
   weights): modules whose direct parameters agree — same shape; sum, |sum| and norm equal
   within twice the unit round-off of the lower dtype (a cast moves each element by at most
   that, relatively); head values equal after rounding both to the lower dtype — are
   candidates. Where both dumps hold the full weights, candidates are confirmed by comparing
   the arrays exactly after the cast.
2. A candidate that is the only one on both sides is a pair.
3. Containers: golden G pairs with target T when T is the lowest common ancestor of the
   partners of G's paired descendants and T's paired descendants are exactly those partners.
4. Inside each matched pair, the nodes still unpaired (looking through unpaired containers)
   pair by position: weighted ones with identical fingerprints (the all-ones norms) in
   execution order when their counts agree; weightless ones (activations, rotary) by type and
   count, or when a single weightless leaf is left on each side whatever its class. Steps 3–4
   repeat until nothing changes. What remains unpaired is listed in the notes.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from itertools import permutations
from typing import TYPE_CHECKING

from layerwatch.engine.records import Locator, ParamPrint, Topology

if TYPE_CHECKING:
    import numpy as np

_UNIT_ROUNDOFF = {
    "bfloat16": 2.0**-8,
    "float16": 2.0**-11,
    "float32": 2.0**-24,
    "float64": 2.0**-53,
}
_HEAD = 16


@dataclass
class WeightMatch:
    pairs: dict[str, str] = field(default_factory=dict)
    """Target node → golden node."""
    notes: list[str] = field(default_factory=list)


def _lower(a: str, b: str) -> str:
    return a if _UNIT_ROUNDOFF.get(a, 0.0) >= _UNIT_ROUNDOFF.get(b, 0.0) else b


def round_to(values: object, dtype: str) -> np.ndarray:
    """Round float values to ``dtype``'s precision (round to nearest even), returned as float32."""
    import numpy as np

    arr = np.asarray(values, dtype=np.float32)
    if dtype == "bfloat16":
        bits = arr.view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return rounded.astype(np.uint32).view(np.float32)
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return arr.astype(np.float16).astype(np.float32)
    return arr


def prints_agree(a: ParamPrint, b: ParamPrint) -> bool:
    """Could ``a`` and ``b`` be the same parameter, one cast to the other's dtype?"""
    if tuple(a.shape) != tuple(b.shape):
        return False
    low = _lower(a.dtype, b.dtype)
    tol = 2.0 * max(_UNIT_ROUNDOFF.get(low, 2.0**-8), 1e-6)
    scale = max(a.abs_sum, b.abs_sum)
    slack = 1e-30 + (6e-8 * _numel(a.shape) if low == "float16" else 0.0)
    if abs(a.sum - b.sum) > tol * scale + slack or abs(a.abs_sum - b.abs_sum) > tol * scale + slack:
        return False
    if abs(a.norm - b.norm) > tol * max(a.norm, b.norm) + slack:
        return False
    n = min(len(a.head), len(b.head))
    if n == 0:
        return True
    import numpy as np

    return bool(np.array_equal(round_to(a.head[:n], low), round_to(b.head[:n], low)))


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= int(d)
    return out


def print_of(array: object, dtype: str) -> ParamPrint:
    """The fingerprint of a loaded parameter (float64 sums, as the capture computes them)."""
    import numpy as np

    arr = np.asarray(array)
    flat = arr.reshape(-1).astype(np.float64)
    return ParamPrint(
        tuple(int(d) for d in arr.shape),
        dtype,
        float(flat.sum()),
        float(np.abs(flat).sum()),
        float(np.sqrt(np.dot(flat, flat))),
        tuple(float(v) for v in flat[:_HEAD]),
    )


class _Side:
    """One run's modules, their parameter fingerprints and (optionally) full weights."""

    def __init__(self, topo: Topology, weights: dict[str, Locator]) -> None:
        self.topo = topo
        self.weights = weights
        self.position = {name: i for i, name in enumerate(topo.nodes)}
        self.prints: dict[str, dict[str, ParamPrint]] = {}
        self.locs: dict[str, dict[str, Locator]] = defaultdict(dict)
        for full, loc in weights.items():
            if "." in full:
                owner, local = full.rsplit(".", 1)
                if owner in topo.nodes:
                    self.locs[owner][local] = loc
        for name, node in topo.nodes.items():
            prints = dict(node.params)
            for local, loc in self.locs.get(name, {}).items():
                if local not in prints:
                    from layerwatch.engine.readers.load import load_array

                    prints[local] = print_of(load_array(loc), loc.dtype)
            if prints:
                self.prints[name] = prints
        self.depth: dict[str, int] = {}
        for name in topo.nodes:
            self.depth[name] = self._depth(name)

    def _depth(self, name: str) -> int:
        depth, parent = 0, self.topo.nodes[name].parent
        while parent is not None and parent in self.topo.nodes:
            depth, parent = depth + 1, self.topo.nodes[parent].parent
        return depth

    def order_key(self, name: str) -> tuple[int, int]:
        order = self.topo.nodes[name].order
        return (0, order) if order >= 0 else (1, self.position[name])

    def lca(self, names: set[str]) -> str | None:
        it = iter(names)
        current = next(it, None)
        for name in it:
            a: str | None = current
            b: str | None = name
            while a is not None and b is not None and a != b:
                if self.depth.get(a, 0) >= self.depth.get(b, 0):
                    a = self.topo.nodes[a].parent
                else:
                    b = self.topo.nodes[b].parent
            current = a if a == b else None
            if current is None:
                return None
        return current


def _modules_agree(g: _Side, gname: str, t: _Side, tname: str, cache: dict[str, object]) -> bool:
    gp, tp = g.prints[gname], t.prints[tname]
    if len(gp) != len(tp):
        return False
    if set(gp) == set(tp):
        orders = [list(gp)]
        tl = list(gp)
    else:
        tl = list(tp)
        orders = [list(p) for p in permutations(gp)] if len(gp) <= 4 else [list(gp)]
    for gl in orders:
        if all(prints_agree(gp[a], tp[b]) for a, b in zip(gl, tl, strict=True)):
            return _exact(g, gname, gl, t, tname, tl, cache)
    return False


def _exact(
    g: _Side,
    gname: str,
    gl: list[str],
    t: _Side,
    tname: str,
    tl: list[str],
    cache: dict[str, object],
) -> bool:
    """Full weights on both sides: equal after casting both to the lower dtype."""
    import numpy as np
    from layerwatch.engine.readers.load import load_array

    for a, b in zip(gl, tl, strict=True):
        ga, ta = g.locs.get(gname, {}).get(a), t.locs.get(tname, {}).get(b)
        if ga is None or ta is None:
            continue
        low = _lower(ga.dtype, ta.dtype)
        arrays = []
        for loc in (ga, ta):
            key = f"{loc.path}:{loc.offset}"
            if key not in cache:
                cache[key] = load_array(loc)
            arrays.append(round_to(np.asarray(cache[key], dtype=np.float32), low))
        if not np.array_equal(arrays[0], arrays[1]):
            return False
    return True


def match_by_weights(
    golden: Topology,
    target: Topology,
    golden_weights: dict[str, Locator] | None = None,
    target_weights: dict[str, Locator] | None = None,
) -> WeightMatch:
    """Pair target modules with golden modules by identical parameters (module docstring)."""
    g, t = _Side(golden, golden_weights or {}), _Side(target, target_weights or {})
    buckets: dict[tuple, list[str]] = defaultdict(list)
    for name, prints in t.prints.items():
        buckets[tuple(sorted(tuple(p.shape) for p in prints.values()))].append(name)
    cands_g: dict[str, list[str]] = defaultdict(list)
    cands_t: dict[str, list[str]] = defaultdict(list)
    cache: dict[str, object] = {}
    for gname, prints in g.prints.items():
        for tname in buckets.get(tuple(sorted(tuple(p.shape) for p in prints.values())), []):
            if _modules_agree(g, gname, t, tname, cache):
                cands_g[gname].append(tname)
                cands_t[tname].append(gname)
    cache.clear()
    pairs: dict[str, str] = {}  # golden → target while building
    for gname, ts in cands_g.items():
        if len(ts) == 1 and len(cands_t[ts[0]]) == 1:
            pairs[gname] = ts[0]
    group = _components(cands_g, cands_t)
    for final in (False, True):
        if final and not _global(g, t, pairs, group):
            break
        for _ in range(len(golden.nodes) + 1):
            changed = _containers(g, t, pairs)
            changed = _positional(g, t, pairs, group) or changed
            if not changed:
                break
    result = WeightMatch({tn: gn for gn, tn in pairs.items()})
    result.notes = _notes(g, t, pairs)
    return result


def _components(
    cands_g: dict[str, list[str]], cands_t: dict[str, list[str]]
) -> dict[tuple[str, str], int]:
    """Connected components of the candidate graph: ('g'|'t', node) → component id."""
    group: dict[tuple[str, str], int] = {}
    next_id = 0
    for start in cands_g:
        if ("g", start) in group:
            continue
        stack = [("g", start)]
        while stack:
            item = stack.pop()
            if item in group:
                continue
            group[item] = next_id
            side, name = item
            others = cands_g.get(name, []) if side == "g" else cands_t.get(name, [])
            stack.extend(("t" if side == "g" else "g", o) for o in others)
        next_id += 1
    return group


def _paired_below(side: _Side, name: str, paired: set[str]) -> set[str]:
    out: set[str] = set()
    stack = list(side.topo.nodes[name].children)
    while stack:
        current = stack.pop()
        if current in paired:
            out.add(current)
        stack.extend(side.topo.nodes[current].children)
    return out


def _containers(g: _Side, t: _Side, pairs: dict[str, str]) -> bool:
    changed = False
    paired_g = set(pairs)
    paired_t = set(pairs.values())
    for gname in sorted(g.topo.nodes, key=lambda n: -g.depth[n]):
        if gname in paired_g or not g.topo.nodes[gname].children:
            continue
        partners = {pairs[d] for d in _paired_below(g, gname, paired_g)}
        if not partners:
            continue
        tname = t.lca(partners)
        # A golden wrapper around one paired target subtree (LCA among the partners) is left alone.
        if tname is None or tname in paired_t or tname in partners:
            continue
        if _paired_below(t, tname, paired_t) == partners:
            pairs[gname] = tname
            paired_g.add(gname)
            paired_t.add(tname)
            changed = True
    return changed


def _global(g: _Side, t: _Side, pairs: dict[str, str], group: dict[tuple[str, str], int]) -> bool:
    """Identical weights still ambiguous after the local steps (tied embeddings): zip each
    fingerprint group model-wide in execution order when both sides have as many left."""
    members: dict[int, tuple[list[str], list[str]]] = defaultdict(lambda: ([], []))
    paired_t = set(pairs.values())
    for (tag, name), component in group.items():
        if tag == "g" and name not in pairs:
            members[component][0].append(name)
        elif tag == "t" and name not in paired_t:
            members[component][1].append(name)
    changed = False
    for g_names, t_names in members.values():
        if g_names and len(g_names) == len(t_names):
            g_names.sort(key=g.order_key)
            t_names.sort(key=t.order_key)
            pairs.update(zip(g_names, t_names, strict=True))
            changed = True
    return changed


def _scope(side: _Side, name: str, paired: set[str]) -> list[str]:
    """Unpaired descendants of ``name`` reachable without crossing a paired node."""
    out: list[str] = []
    stack = list(side.topo.nodes[name].children)
    while stack:
        current = stack.pop()
        if current in paired:
            continue
        out.append(current)
        stack.extend(side.topo.nodes[current].children)
    return out


def _positional(
    g: _Side, t: _Side, pairs: dict[str, str], group: dict[tuple[str, str], int]
) -> bool:
    changed = False
    for gname, tname in list(pairs.items()):
        paired_g, paired_t = set(pairs), set(pairs.values())
        g_scope, t_scope = _scope(g, gname, paired_g), _scope(t, tname, paired_t)
        if not g_scope or not t_scope:
            continue
        g_groups: dict[object, list[str]] = defaultdict(list)
        t_groups: dict[object, list[str]] = defaultdict(list)
        for name in g_scope:
            g_groups[_kind(g, "g", name, group)].append(name)
        for name in t_scope:
            t_groups[_kind(t, "t", name, group)].append(name)
        for kind, g_names in g_groups.items():
            t_names = t_groups.get(kind, [])
            if kind is None or len(t_names) != len(g_names):
                continue
            g_names.sort(key=g.order_key)
            t_names.sort(key=t.order_key)
            for a, b in zip(g_names, t_names, strict=True):
                pairs[a] = b
                changed = True
        # One weightless leaf left on each side (HF ``SiLUActivation`` vs ``nn.SiLU``): they pair.
        g_left = [n for n in g_scope if n not in pairs and _weightless_leaf(g, n)]
        paired_t = set(pairs.values())
        t_left = [n for n in t_scope if n not in paired_t and _weightless_leaf(t, n)]
        if len(g_left) == 1 and len(t_left) == 1:
            pairs[g_left[0]] = t_left[0]
            changed = True
    return changed


def _weightless_leaf(side: _Side, name: str) -> bool:
    return name not in side.prints and not side.topo.nodes[name].children


def _kind(side: _Side, tag: str, name: str, group: dict[tuple[str, str], int]) -> object:
    if name in side.prints:
        component = group.get((tag, name))
        return ("w", component) if component is not None else None
    node = side.topo.nodes[name]
    return ("t", node.type) if node.type else None


def _notes(g: _Side, t: _Side, pairs: dict[str, str]) -> list[str]:
    notes = [f"auto-map: {len(pairs)} modules paired by weights and position"]
    for label, side, paired in (("golden", g, set(pairs)), ("target", t, set(pairs.values()))):
        left = sorted((n for n in side.topo.nodes if n not in paired), key=side.order_key)
        if left:
            shown = ", ".join(left[:6]) + (f" (+{len(left) - 6} more)" if len(left) > 6 else "")
            notes.append(f"auto-map: {len(left)} {label} modules unpaired: {shown}")
    return notes
