"""Which golden tensor a target tensor is compared with.

Golden names are the reference: every target key is mapped to a golden key. In order of
precedence: node pairs found by weights (``--auto-map``, see :mod:`.weightmap`) or by msit's
``op_mapping_file.json``; then the user's regex rules (``--map rules.toml``); then the name
itself. A golden node already claimed by a weight/op pair is never also paired by name.

Rules file (TOML or JSON), applied in file order with ``re.sub`` to every *target* name::

    [[node]]                      # node rules: target module path → golden module path
    pattern = '^root\\.layers\\.(\\d+)\\.attention\\.wq$'
    replace = 'root.model.layers.\\1.self_attn.q_proj'

    [[stem]]                      # tensor rules: target file stem → golden stem
    pattern = '^output$'
    replace = 'output_0'
    node = 'attention$'           # optional: only for target nodes matching this regex

JSON: ``{"node": [{"pattern": ..., "replace": ...}, ...], "stem": [...]}`` (a rule may also be a
``[pattern, replace]`` pair). ``[[shard]]`` rules (``pattern``, ``dim``) say how a tensor-parallel
target's tensors are split (``engine/session/ranks.py``; ignored here). msit's ``op_mapping_file.json`` (or the directory holding it, as
msit's ``-mf`` takes) is recognised by its shape and used as msit does: by type within zipped
layers.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.records import Locator, TensorKey, Topology
from layerwatch.engine.session.blocks import find_layers

if TYPE_CHECKING:
    from layerwatch.engine.session.weightmap import WeightMatch

MSIT_MAPPING_FILE = "op_mapping_file.json"
_MSIT_KEY = re.compile(r"^[A-Za-z0-9_]*$")
_OUTTENSOR = re.compile(r"^(.*?)(?:_outtensor(\d+))?$")
_OUTPUT = re.compile(r"^(.*?)(?:_output_(\d+))?$")


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern[str]
    replace: str
    node: re.Pattern[str] | None = None
    """Stem rules only: restrict to target nodes matching this."""


@dataclass
class NameRules:
    """Ordered regex → replacement rules for target node names and tensor stems."""

    node: list[Rule] = field(default_factory=list)
    stem: list[Rule] = field(default_factory=list)
    source: str = ""

    def map_node(self, name: str) -> str:
        for rule in self.node:
            name = rule.pattern.sub(rule.replace, name)
        return name

    def map_stem(self, node: str, stem: str) -> str:
        for rule in self.stem:
            if rule.node is None or rule.node.search(node):
                stem = rule.pattern.sub(rule.replace, stem)
        return stem


@dataclass
class MsitOpMapping:
    """msit's ``{"ATBType[_outtensorN]": ["TorchClass[_output_N]", ...]}`` manual mapping."""

    entries: list[tuple[str, int | None, str, int | None]]
    """(target type, target output index, golden type, golden output index)."""
    source: str = ""


MappingSpec = NameRules | MsitOpMapping


def load_mapping(path: str | Path) -> MappingSpec:
    """Read a rules file (TOML/JSON) or msit's ``op_mapping_file.json``; one-line errors."""
    p = Path(path)
    if p.is_dir():
        p = p / MSIT_MAPPING_FILE
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise LayerwatchError(f"cannot read mapping file {p}: {exc.strerror or exc}") from None
    if p.suffix.lower() == ".toml":
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise LayerwatchError(f"mapping file {p} is not valid TOML: {exc}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise LayerwatchError(f"mapping file {p} is not valid JSON: {exc}") from None
    if isinstance(data, dict) and data and not ({"node", "stem", "shard"} & set(data)):
        return _msit_mapping(data, str(p))
    return _rules(data, str(p))


def _rules(data: object, source: str) -> NameRules:
    if not isinstance(data, dict) or not set(data) <= {"node", "stem", "shard"}:
        raise LayerwatchError(
            f"mapping file {source}: expected 'node' and/or 'stem' (and 'shard') rule lists"
        )
    rules = NameRules(source=source)
    for kind in ("node", "stem"):
        items = data.get(kind, [])
        if not isinstance(items, list):
            raise LayerwatchError(f"mapping file {source}: '{kind}' must be a list of rules")
        for i, item in enumerate(items):
            if isinstance(item, list | tuple) and len(item) == 2:
                pattern, replace, scope = item[0], item[1], None
            elif isinstance(item, dict) and "pattern" in item and "replace" in item:
                pattern, replace, scope = item["pattern"], item["replace"], item.get("node")
            else:
                raise LayerwatchError(
                    f"mapping file {source}: {kind} rule {i + 1} needs 'pattern' and 'replace'"
                )
            try:
                compiled = re.compile(str(pattern))
                node_re = re.compile(str(scope)) if scope is not None else None
                compiled.sub(str(replace), "")  # bad group references fail here, not later
            except (re.error, IndexError) as exc:
                raise LayerwatchError(
                    f"mapping file {source}: {kind} rule {i + 1}: {exc}"
                ) from None
            getattr(rules, kind).append(Rule(compiled, str(replace), node_re))
    return rules


def _msit_mapping(data: dict[str, object], source: str) -> MsitOpMapping:
    entries: list[tuple[str, int | None, str, int | None]] = []
    for key, values in data.items():
        if isinstance(values, str):
            values = [values]  # msit iterates a plain string per character; we take it whole
        if (
            not _MSIT_KEY.match(key)
            or not isinstance(values, list)
            or not all(isinstance(v, str) and _MSIT_KEY.match(v) for v in values)
        ):
            raise LayerwatchError(
                f"{source} is neither a rules file nor msit's op mapping "
                f'({{"ATBType[_outtensorN]": ["TorchClass[_output_N]", ...]}}): bad entry {key!r}'
            )
        kmatch = _OUTTENSOR.match(key)
        assert kmatch is not None
        for value in values:
            vmatch = _OUTPUT.match(value)
            assert vmatch is not None
            entries.append(
                (
                    kmatch.group(1),
                    int(kmatch.group(2)) if kmatch.group(2) else None,
                    vmatch.group(1),
                    int(vmatch.group(2)) if vmatch.group(2) else None,
                )
            )
    return MsitOpMapping(entries, source)


def _subtree(topo: Topology, name: str) -> list[str]:
    out: list[str] = []
    stack = [name]
    while stack:
        current = stack.pop()
        out.append(current)
        node = topo.nodes.get(current)
        if node is not None:
            stack.extend(reversed(node.children))
    return out


def _exec_key(topo: Topology, name: str) -> tuple[int, int]:
    order = topo.nodes[name].order
    return (0, order) if order >= 0 else (1, 0)


def msit_pairs(
    spec: MsitOpMapping, golden: Topology, target: Topology
) -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    """Node pairs (target → golden) and stem pairs from msit's mapping, by type within zipped layers.

    As msit does: layers of both sides are zipped in order; inside a layer pair the target nodes
    whose type contains the ATB type and the golden nodes whose type contains the torch class
    are zipped in execution order when their counts are equal.
    """
    nodes: dict[str, str] = {}
    stems: dict[tuple[str, str], str] = {}
    _, g_layers = find_layers(golden)
    _, t_layers = find_layers(target)
    for g_layer, t_layer in zip(g_layers, t_layers, strict=False):
        g_sub = _subtree(golden, g_layer)
        t_sub = _subtree(target, t_layer)
        for t_type, t_index, g_type, g_index in spec.entries:
            t_hits = sorted(
                (n for n in t_sub if t_type and t_type in target.nodes[n].type),
                key=lambda n: _exec_key(target, n),
            )
            g_hits = sorted(
                (n for n in g_sub if g_type and g_type in golden.nodes[n].type),
                key=lambda n: _exec_key(golden, n),
            )
            if not t_hits or len(t_hits) != len(g_hits):
                continue
            for t_node, g_node in zip(t_hits, g_hits, strict=True):
                if nodes.setdefault(t_node, g_node) != g_node:
                    continue
                if t_index is not None:
                    g_stem = f"output_{g_index}" if g_index is not None else "output"
                    for t_stem in (f"output_{t_index}", f"outtensor{t_index}"):
                        stems[(t_node, t_stem)] = g_stem
    return nodes, stems


@dataclass
class Pairer:
    """Maps target keys to golden keys; rebuilt when topologies or weights arrive."""

    spec: MappingSpec | None = None
    auto: bool | None = None
    """True: pair by weights; False: never; None: only when names leave most nodes unpaired."""
    node_map: dict[str, str] = field(default_factory=dict)
    stem_map: dict[tuple[str, str], str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    mode: str = "name"
    """``name``, ``rules``, ``msit-mapping``, ``weights``: what decided the pairs (for the notes)."""
    _claimed: set[str] = field(default_factory=set)
    _weight_cache: tuple[tuple[Topology, Topology, int, int], WeightMatch] | None = None
    _node_cache: dict[str, str | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.spec, NameRules):
            self.mode = "rules"

    def golden_key(self, key: TensorKey) -> TensorKey | None:
        """The golden key a target tensor pairs with (``None``: nothing it could pair with)."""
        node = self._node_cache.get(key.node, "")
        if node == "":
            node = self._node_cache[key.node] = self._golden_node(key.node)
        if node is None:
            return None
        stem = self.stem_map.get((key.node, key.stem))
        if stem is None:
            stem = (
                self.spec.map_stem(key.node, key.stem)
                if isinstance(self.spec, NameRules)
                else key.stem
            )
        if node == key.node and stem == key.stem:
            return key
        return TensorKey(key.token, node, stem, key.rank)

    def _golden_node(self, node: str) -> str | None:
        mapped = self.node_map.get(node)
        if mapped is not None:
            return mapped
        name = self.spec.map_node(node) if isinstance(self.spec, NameRules) else node
        return None if name in self._claimed else name

    def rebuild(
        self,
        golden: Topology | None,
        target: Topology | None,
        golden_nodes: set[str],
        target_nodes: set[str],
        weights: tuple[dict[str, Locator], dict[str, Locator]] = ({}, {}),
    ) -> bool:
        """Recompute the node pairs from what is known now; True when they changed."""
        old = (dict(self.node_map), dict(self.stem_map))
        self.node_map, self.stem_map, self.notes = {}, {}, []
        self.mode = "rules" if isinstance(self.spec, NameRules) else "name"
        if isinstance(self.spec, MsitOpMapping) and golden is not None and target is not None:
            self.node_map, self.stem_map = msit_pairs(self.spec, golden, target)
            self.mode = "msit-mapping"
        elif self._want_weights(golden, target, golden_nodes, target_nodes, weights):
            from layerwatch.engine.session.weightmap import match_by_weights

            assert golden is not None and target is not None
            # Same topology objects and weight counts: the (costly) match cannot have changed.
            key = (golden, target, len(weights[0]), len(weights[1]))
            cached = self._weight_cache
            if (
                cached is None
                or any(a is not b for a, b in zip(cached[0][:2], key[:2], strict=True))
                or cached[0][2:] != key[2:]
            ):
                cached = (key, match_by_weights(golden, target, *weights))
                self._weight_cache = cached
            found = cached[1]
            self.node_map = dict(found.pairs)
            self.notes = found.notes
            self.mode = "weights"
        self._claimed = set(self.node_map.values())
        self._node_cache = {}
        return (self.node_map, self.stem_map) != old

    def _want_weights(
        self,
        golden: Topology | None,
        target: Topology | None,
        golden_nodes: set[str],
        target_nodes: set[str],
        weights: tuple[dict[str, Locator], dict[str, Locator]],
    ) -> bool:
        if self.auto is False or golden is None or target is None:
            return False
        if not (_has_params(golden) or weights[0]) or not (_has_params(target) or weights[1]):
            return False
        if self.auto:
            return True
        # Fallback: name pairing (after the rules) leaves most nodes unpaired.
        if not golden_nodes or not target_nodes:
            return False
        mapped = {
            self.spec.map_node(n) if isinstance(self.spec, NameRules) else n for n in target_nodes
        }
        return len(mapped & golden_nodes) < 0.5 * max(len(golden_nodes), len(mapped))


def _has_params(topo: Topology) -> bool:
    return any(node.params for node in topo.nodes.values())
