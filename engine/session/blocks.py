"""Grid columns from a module tree: what runs before the repeated layers, each layer, what runs after.

msit finds decoder layers only in a node with more than 10 children of which more than 5 share a
type, so models with ≤ 10 layers get no layer view. Here the repeated container is found by
structure, for any layer count:

1. Among every node's *non-leaf* children, group them by type (children without a type but with a
   numeric name, like ``layers.3``, form one group). The group with at least two members that
   covers the most modules (sum of the members' subtree sizes) is the layer list; ties go to the
   group with more members, then to the earlier node. Leaf groups (the four ``Linear`` of an
   attention) never qualify, and a group nested in one layer always covers less than the layers.
2. No such group (a 1-layer model): the numbered non-leaf children (``layers.0``) covering the
   most modules.
3. Nothing: no layer columns; every child of the root is one column.

Every other child of the root→container path is one column, ``pre`` when it finishes before the
first layer starts, ``post`` otherwise. Tensors of the containers on that path (``root``,
``root.model``) go to the last column for outputs (the root's output is the logits) and to the
first column for inputs (the root's input ids feed the embedding).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from layerwatch.engine.records import Topology
from layerwatch.engine.seam import BlockInfo

_LAYER_NAME = re.compile(r"^(.*?\.(?:layers|layer|h|blocks|block|decoder_layers))\.(\d+)(?:\.|$)")
"""Name pattern used before any topology is known (``root.model.layers.3.mlp`` → layer 3)."""

_SHORT = {
    "embed_tokens": "embed",
    "tok_embeddings": "embed",
    "word_embeddings": "embed",
    "wte": "embed",
    "wpe": "pos",
    "rotary_emb": "rotary",
    "embeddings": "embed",
}


def _short(name: str) -> str:
    last = name.rsplit(".", 1)[-1]
    return _SHORT.get(last, last[:10])


def _tail_int(name: str) -> int | None:
    last = name.rsplit(".", 1)[-1]
    return int(last) if last.isdigit() else None


@dataclass
class BlockLayout:
    """Columns and the node → column assignment for one topology."""

    blocks: tuple[BlockInfo, ...]
    container: str | None
    """The repeated container (``root.model.layers``), or ``None`` when no layers were found."""
    heads: dict[str, int] = field(default_factory=dict)
    """Block head node → block index."""
    path: frozenset[str] = frozenset()
    """Containers from the root down to the layer list: their tensors go to the first/last column."""
    _cache: dict[tuple[str, str], int] = field(default_factory=dict, repr=False)

    def block_of(self, node: str, part: str = "output") -> int:
        """Column of a tensor of ``node`` (``part`` = ``input``/``output``); -1 when unknown."""
        key = (node, part)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._resolve(node, part)
        return hit

    def _resolve(self, node: str, part: str) -> int:
        if not self.blocks:
            return -1
        name = node
        while True:
            if name in self.heads:
                return self.heads[name]
            if name in self.path:
                return 0 if part == "input" else len(self.blocks) - 1
            if "." not in name:
                break
            name = name.rsplit(".", 1)[0]
        match = _LAYER_NAME.match(node)
        if match is not None:
            for info in self.blocks:
                if info.kind == "layer" and info.node.endswith("." + match.group(2)):
                    return info.index
        return -1


def subtree_sizes(topo: Topology) -> dict[str, int]:
    sizes: dict[str, int] = {}

    def size(name: str) -> int:
        stack = [(name, False)]
        while stack:
            current, done = stack.pop()
            if current in sizes:
                continue
            node = topo.nodes.get(current)
            children = node.children if node is not None else []
            if done or not children:
                sizes[current] = 1 + sum(sizes.get(c, 1) for c in children)
            else:
                stack.append((current, True))
                stack.extend((c, False) for c in children if c not in sizes)
        return sizes[name]

    for name in list(topo.nodes):
        size(name)
    return sizes


def find_layers(topo: Topology) -> tuple[str | None, list[str]]:
    """The repeated container and its layers in index order (see the module docstring)."""
    sizes = subtree_sizes(topo)
    best: tuple[int, int, int] | None = None
    chosen: tuple[str, list[str]] | None = None
    numbered: tuple[int, int] | None = None
    numbered_choice: tuple[str, list[str]] | None = None
    for position, node in enumerate(topo.nodes.values()):
        groups: dict[str, list[str]] = {}
        indexed: list[str] = []
        for child in node.children:
            child_node = topo.nodes.get(child)
            if child_node is None or not child_node.children:
                continue
            if _tail_int(child) is not None:
                indexed.append(child)
            group = child_node.type or ("#n" if _tail_int(child) is not None else "#" + child)
            groups.setdefault(group, []).append(child)
        for members in groups.values():
            if len(members) < 2:
                continue
            score = (sum(sizes[m] for m in members), len(members), -position)
            if best is None or score > best:
                best, chosen = score, (node.name, members)
        if indexed:
            score2 = (sum(sizes[m] for m in indexed), -position)
            if numbered is None or score2 > numbered:
                numbered, numbered_choice = score2, (node.name, indexed)
    pick = chosen or numbered_choice
    if pick is None:
        return None, []
    container, members = pick
    if all(_tail_int(m) is not None for m in members):
        members = sorted(members, key=lambda m: _tail_int(m) or 0)
    else:
        members = sorted(members, key=lambda m: _first_order(topo, m))
    return container, members


def _first_order(topo: Topology, name: str) -> tuple[int, int]:
    """Earliest completion order inside ``name``'s subtree (= when it starts), -1s last."""
    best = -1
    stack = [name]
    while stack:
        node = topo.nodes.get(stack.pop())
        if node is None:
            continue
        if node.order >= 0 and (best < 0 or node.order < best):
            best = node.order
        stack.extend(node.children)
    return (0, best) if best >= 0 else (1, 0)


def layout_for(topo: Topology | None) -> BlockLayout:
    """Compute the grid columns of a topology (``None`` → no columns yet)."""
    if topo is None or not topo.nodes:
        return BlockLayout((), None)
    container, layers = find_layers(topo)
    root = topo.root if topo.root in topo.nodes else next(iter(topo.nodes))
    has_orders = any(n.order >= 0 for n in topo.nodes.values())
    if container is None:
        kids = _ran(topo, topo.nodes[root].children, has_orders)
        kids.sort(key=lambda c: _first_order(topo, c))
        if not kids:
            kids = [root]
        blocks = tuple(BlockInfo(i, _short(c), "pre", c) for i, c in enumerate(kids))
        return BlockLayout(blocks, None, {b.node: b.index for b in blocks}, frozenset({root}))
    path = _path_to(topo, root, container)
    layer_set = set(layers)
    start = _first_order(topo, layers[0])
    pre: list[str] = []
    post: list[str] = []
    for ancestor in path:
        for position, child in enumerate(topo.nodes[ancestor].children):
            if child in path or child in layer_set:
                continue
            first = _first_order(topo, child)
            if first[0] == 1 and has_orders:
                continue  # never ran
            if first[0] == 0 and start[0] == 0:
                (pre if first < start else post).append(child)
            else:
                declared_before = _declared_before(topo, ancestor, position, path, layer_set)
                (pre if declared_before else post).append(child)
    pre.sort(key=lambda c: _first_order(topo, c))
    post.sort(key=lambda c: _first_order(topo, c))
    infos: list[BlockInfo] = []
    for name in pre:
        infos.append(BlockInfo(len(infos), _short(name), "pre", name))
    for i, name in enumerate(layers):
        index = _tail_int(name)
        infos.append(BlockInfo(len(infos), f"L{index if index is not None else i}", "layer", name))
    for name in post:
        infos.append(BlockInfo(len(infos), _short(name), "post", name))
    blocks = tuple(infos)
    return BlockLayout(blocks, container, {b.node: b.index for b in blocks}, frozenset(path))


def _ran(topo: Topology, names: list[str], has_orders: bool) -> list[str]:
    return [n for n in names if not has_orders or _first_order(topo, n)[0] == 0]


def _path_to(topo: Topology, root: str, container: str) -> list[str]:
    path = [container]
    name = container
    while name != root:
        parent = topo.nodes[name].parent if name in topo.nodes else None
        if parent is None:
            break
        path.append(parent)
        name = parent
    return path[::-1]


def _declared_before(
    topo: Topology, ancestor: str, position: int, path: list[str], layers: set[str]
) -> bool:
    """Without orders: a child declared before the branch leading to the layers runs before them."""
    children = topo.nodes[ancestor].children
    for i, child in enumerate(children):
        if child in path or child in layers:
            return position < i
    return True


def topology_from_names(nodes: dict[str, tuple[str, int]], root: str = "root") -> Topology:
    """A topology guessed from tensor records alone: ``{node: (type, order)}``.

    Parents come from the dotted names; containers that produced no tensor (``ModuleList``) are
    created without a type. Used until the dump's own topology arrives.
    """
    topo = Topology(root=root)
    for name in sorted(nodes, key=lambda n: (n.count("."), n)):
        type_, order = nodes[name]
        parent = name.rsplit(".", 1)[0] if "." in name else None
        if parent is not None:
            _ensure(topo, parent, nodes)
        topo.add(name, type_, parent, order)
    if root not in topo.nodes and topo.nodes:
        topo.root = min(topo.nodes, key=lambda n: (n.count("."), n))
    return topo


def _ensure(topo: Topology, name: str, nodes: dict[str, tuple[str, int]]) -> None:
    if name in topo.nodes:
        return
    parent = name.rsplit(".", 1)[0] if "." in name else None
    if parent is not None:
        _ensure(topo, parent, nodes)
    type_, order = nodes.get(name, ("", -1))
    topo.add(name, type_, parent, order)
