"""Reader for msprobe dumps: ``step*/rank*|proc*/dump.json`` (+ ``dump_tensor_data/*.pt``,
``construct.json``), tensor and statistics-only tasks.

msprobe has no token axis and numbers calls per API name across the whole step, so one extra op
shifts every later counter. We rebuild tokens and stable names:

* tokens: entries are in completion order; the top-level modules (no parent in construct.json)
  run once per forward, and the last of them to finish (the one just before a top-level module
  repeats, e.g. ``lm_head``) closes a token. APIs before the first forward belong to token 0.
* nodes: modules → ``root.{module path}``; APIs → ``root.{parent module path}.{Prefix}.{api}.{k}``
  with ``k`` counted per parent module within the token, so a shifted counter stays local.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.readers.base import RankIndex, ReaderUpdate, scandir, skipped_note
from layerwatch.engine.readers.load import canonical_dtype, load_array
from layerwatch.engine.readers.pth import PthIncomplete, pth_locator
from layerwatch.engine.records import Locator, Stats, TensorKey, TensorRecord, Topology

DUMP = "dump.json"
CONSTRUCT = "construct.json"
DATA_DIR = "dump_tensor_data"
_MODULE = re.compile(r"^Module\.(?:(.+)\.)?([^.]+)\.forward\.(\d+)$")
_API = re.compile(r"^(.+)\.(\d+)\.forward$")
_STEP = re.compile(r"^step(\d+)$")
_RANK = re.compile(r"^(rank|proc)(\d+)$")
_INTS = ("int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64")


@dataclass(frozen=True, slots=True)
class Where:
    steps: tuple[Path, ...] | None
    """Step directories, or ``None``: discover ``step*`` under ``base``."""
    base: Path
    rank_dirs: tuple[Path, ...] | None = None
    """Only these rank directories (the user pointed at one)."""


def locate(path: Path) -> Where | None:
    if path.is_file() and path.name == DUMP:
        return Where((path.parent.parent,), path.parent.parent, (path.parent,))
    if (path / DUMP).is_file():
        return Where((path.parent,), path.parent, (path,))
    entries = scandir(path)
    if any(
        e.is_dir() and _RANK.match(e.name) and os.path.isfile(os.path.join(e.path, DUMP))
        for e in entries
    ):
        return Where((path,), path)
    steps = [e for e in entries if e.is_dir() and _STEP.match(e.name)]
    if any(_RANK.match(r.name) for s in steps for r in scandir(s.path)):
        return Where(None, path)
    return None


@dataclass(slots=True)
class _RankState:
    path: Path
    rank: int
    sig: tuple[int, int] | None = None
    pending: set[TensorKey] = field(default_factory=set)


class MsprobeReader:
    """Reads msprobe PyTorch dumps (tensor or statistics)."""

    fmt = "msprobe"

    def __init__(self, root: Path) -> None:
        self.root = root
        where = locate(root)
        if where is None:
            raise LayerwatchError(f"{root} is not an msprobe dump")
        self._where = where
        self._index = RankIndex()
        self._ranks: dict[tuple[str, str], _RankState] = {}
        self._keys: set[TensorKey] = set()
        self._weights: set[str] = set()
        self._token_offset: dict[tuple[str, str], int] = {}
        self._tokens_in_step: dict[str, int] = {}
        self._ids: set[tuple[int, int]] = set()
        self._topology_nodes: set[str] = set()
        self._gone_noted = False
        self._notes: set[str] = set()

    def watch_roots(self) -> list[Path]:
        return [self.root if self.root.is_dir() else self.root.parent]

    def poll(self, changed: Sequence[Path] | None = None, *, final: bool = False) -> ReaderUpdate:
        update = ReaderUpdate()
        if not self.root.exists():
            if not self._gone_noted:
                update.notes.append(f"{self.root}: dump directory disappeared")
                self._gone_noted = True
            return update
        steps = self._steps()
        wanted: set[Path] | None = None
        if changed is not None:
            wanted = set()
            for p in (Path(os.path.abspath(c)) for c in changed):
                for cand in (p, *p.parents):
                    if _RANK.match(cand.name):
                        wanted.add(cand)
                        break
                else:
                    wanted = None  # a step dir or the root changed: look at everything
                    break
        offset = 0
        topo = Topology(root="root")
        topo_changed = False
        for step in steps:
            step_tokens = 0
            for rank_dir in self._rank_dirs(step):
                key = (step.name, rank_dir.name)
                state = self._ranks.get(key)
                if state is None:
                    self._index.assign([rank_dir.name])
                    state = self._ranks[key] = _RankState(
                        rank_dir, _rank_number(rank_dir.name, self._index)
                    )
                if wanted is None or rank_dir in wanted or state.pending:
                    n, added = self._read_rank(
                        state, offset, update, topo, full=changed is None, final=final
                    )
                    topo_changed |= added
                    self._tokens_in_step[str(rank_dir)] = n
                step_tokens = max(step_tokens, self._tokens_in_step.get(str(rank_dir), 0))
            offset += step_tokens
        if topo_changed:
            update.topology = topo
        return update

    def _steps(self) -> list[Path]:
        if self._where.steps is not None:
            return list(self._where.steps)
        steps = [
            Path(e.path) for e in scandir(self._where.base) if e.is_dir() and _STEP.match(e.name)
        ]
        return sorted(steps, key=lambda p: int(_STEP.match(p.name).group(1)))  # type: ignore[union-attr]

    def _rank_dirs(self, step: Path) -> list[Path]:
        if self._where.rank_dirs is not None:
            return [r for r in self._where.rank_dirs if r.parent == step]
        dirs = [Path(e.path) for e in scandir(step) if e.is_dir() and _RANK.match(e.name)]
        return sorted(dirs, key=lambda p: (p.name[:4], int(_RANK.match(p.name).group(2))))  # type: ignore[union-attr]

    # --- one rank of one step -------------------------------------------------------------
    def _read_rank(
        self,
        state: _RankState,
        offset: int,
        update: ReaderUpdate,
        topo: Topology,
        *,
        full: bool,
        final: bool = False,
    ) -> tuple[int, bool]:
        path = state.path / DUMP
        try:
            st = path.stat()
        except OSError:
            return 0, False
        sig = (st.st_mtime_ns, st.st_size)
        if sig == state.sig and not state.pending:
            return self._tokens_in_step.get(str(state.path), 0), False
        try:
            dump = json.loads(path.read_bytes())
            data = dump["data"]
        except (OSError, ValueError, KeyError, TypeError):
            if final and skipped_note(path) not in self._notes:  # never rewritten again
                self._notes.add(skipped_note(path))
                update.notes.append(skipped_note(path))
            return self._tokens_in_step.get(str(state.path), 0), False  # rewritten right now
        try:
            construct = json.loads((state.path / CONSTRUCT).read_bytes())
        except (OSError, ValueError):
            construct = {}
        state.sig = sig
        entries = [(name, value) for name, value in data.items() if isinstance(value, dict)]
        tokens, n_tokens, settled = _assign_tokens(entries, construct or {})
        if not full:
            entries = entries[:settled]
        if entries and not any(_module_parts(name) for name, _ in entries):
            note = f"{state.path}: no module entries (level L1?): every call is put in token 0"
            if note not in self._notes:
                self._notes.add(note)
                update.notes.append(note)
        added = False
        counters: dict[tuple[int, str, str], int] = {}
        order: dict[int, int] = {}
        state.pending.clear()
        data_dir = Path(str(dump.get("dump_data_dir") or "")) if dump.get("dump_data_dir") else None
        local_data = state.path / DATA_DIR
        for i, (name, value) in enumerate(entries):
            token = tokens[i] + offset
            node, node_type, parent = _node_name(name, construct, counters, tokens[i])
            if node is None:
                continue
            if node not in self._topology_nodes:
                added = True
            self._topology_nodes.add(node)
            exec_order = order[token] = order.get(token, -1) + 1
            topo.add(node, node_type, parent, exec_order if token == 0 else -1)
            for stem, leaf in _leaves(value):
                self._leaf(
                    state,
                    token,
                    node,
                    node_type,
                    stem,
                    leaf,
                    exec_order,
                    local_data,
                    data_dir,
                    update,
                    final,
                )
            for pname, leaf in (value.get("parameters") or {}).items():
                wname = f"{node}.{pname}"
                if (
                    wname in self._weights
                    or not isinstance(leaf, dict)
                    or not leaf.get("data_name")
                ):
                    continue
                try:
                    update.weights[wname] = pth_locator(local_data / str(leaf["data_name"]))
                    self._weights.add(wname)
                except LayerwatchError:
                    continue
        return n_tokens, added

    def _leaf(
        self, state: _RankState, token: int, node: str, node_type: str, stem: str, leaf: dict,
        order: int, local_data: Path, data_dir: Path | None, update: ReaderUpdate,
        final: bool = False,
    ) -> None:  # fmt: skip
        key = TensorKey(token, node, stem, state.rank)
        if key in self._keys:
            return
        try:
            dtype = canonical_dtype(str(leaf.get("dtype", "float32")))
        except LayerwatchError as exc:
            update.notes.append(f"{state.path}: {node} {stem}: {exc}")
            self._keys.add(key)
            return
        shape = tuple(int(d) for d in leaf.get("shape") or ())
        stats = Stats(
            _num(leaf.get("Max")),
            _num(leaf.get("Min")),
            _num(leaf.get("Mean")),
            _num(leaf.get("Norm")),
        )
        loc: Locator | None = None
        source = str(state.path / DUMP)
        data_name = leaf.get("data_name")
        if data_name and data_name != "-1":
            file = local_data / str(data_name)
            if not file.exists() and data_dir is not None:
                file = data_dir / str(data_name)
            try:
                loc = pth_locator(file)
                source = str(file)
            except PthIncomplete:
                if final:  # the writer finished: it will never be whole
                    update.notes.append(skipped_note(file))
                    self._keys.add(key)
                    return
                state.pending.add(key)
                return
            except LayerwatchError as exc:
                update.notes.append(str(exc))
                self._keys.add(key)
                return
        self._keys.add(key)
        update.tensors.append(TensorRecord(key, dtype, shape, loc, stats, order, node_type, source))
        if (
            (state.rank, token) not in self._ids
            and stem == "input_0"
            and dtype in _INTS
            and loc is not None
        ):
            try:
                update.token_ids[token] = tuple(int(v) for v in load_array(loc).reshape(-1))
                self._ids.add((state.rank, token))
            except LayerwatchError:
                pass


def _rank_number(name: str, index: RankIndex) -> int:
    match = _RANK.match(name)
    if match and match.group(1) == "rank":
        return int(match.group(2))
    return index(name)


def _num(value: Any) -> float:
    """A statistic as float: bools (bool tensors) → 0/1, ``null`` → NaN, ``"inf"`` strings too."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _module_parts(name: str) -> tuple[str, str] | None:
    """``Module.model.layers.0.mlp.LlamaMLP.forward.3`` → (``model.layers.0.mlp``, ``LlamaMLP``)."""
    match = _MODULE.match(name)
    if match is None:
        return None
    return match.group(1) or "", match.group(2)


def _assign_tokens(entries: list[tuple[str, dict]], construct: dict) -> tuple[list[int], int, int]:
    """Token per entry, the number of tokens, and how many leading entries have a final token.

    The closing module is the top-level module that finishes last in a forward (the one just
    before a top-level module repeats). Top-level APIs right after a token closes (generate's
    argmax, stopping checks) stay with that token; the next entry inside a module opens the next.
    An entry's token depends only on the entries before it, so it never changes as the dump grows,
    once the closing module is known.
    """
    paths = {name: parts[0] for name, _ in entries if (parts := _module_parts(name)) is not None}
    known = set(paths.values())
    top: list[tuple[int, str]] = []
    for i, (name, _) in enumerate(entries):
        if name in paths:
            if construct:
                is_top = construct.get(name) is None
            else:
                is_top = not any(paths[name].startswith(p + ".") for p in known if p != paths[name])
            if is_top:
                top.append((i, paths[name]))
    closing: str | None = None
    seen: set[str] = set()
    for k, (_i, path) in enumerate(top):
        if path in seen:
            closing = top[k - 1][1]
            break
        seen.add(path)
    settled = len(entries) if closing is not None else (top[-1][0] + 1 if top else 0)
    if closing is None and top:
        closing = top[-1][1]
    bounds = {i for i, path in top if path == closing}
    tokens: list[int] = []
    t, in_gap = 0, False
    for i, (name, _) in enumerate(entries):
        top_level_api = name not in paths and construct.get(name) is None
        if in_gap and not top_level_api:
            in_gap = False
        tokens.append(t - 1 if in_gap else t)
        if i in bounds:
            t += 1
            in_gap = True
    return tokens, max(len(bounds), 1 if entries else 0), settled


def _node_name(
    name: str, construct: dict, counters: dict[tuple[int, str, str], int], token: int
) -> tuple[str | None, str, str | None]:
    """(node, node type, parent node) of a forward entry; ``None`` for backward/grad entries."""
    parts = _module_parts(name)
    if parts is not None:
        path, cls = parts
        node = f"root.{path}" if path else "root"
        parent = construct.get(name)
        parent_parts = _module_parts(parent) if isinstance(parent, str) else None
        parent_node = (
            ("root." + parent_parts[0] if parent_parts[0] else "root") if parent_parts else None
        )
        if node != "root" and parent_node is None:
            parent_node = "root"
        return node, cls, parent_node
    match = _API.match(name)
    if match is None:
        return None, "", None
    api = match.group(1)
    parent = construct.get(name)
    parent_parts = _module_parts(parent) if isinstance(parent, str) else None
    parent_node = (
        ("root." + parent_parts[0] if parent_parts[0] else "root") if parent_parts else "root"
    )
    k = counters.get((token, parent_node, api), 0)
    counters[(token, parent_node, api)] = k + 1
    return f"{parent_node}.{api}.{k}", api, parent_node


def _leaves(value: dict) -> list[tuple[str, dict]]:
    """(stem, tensor leaf) pairs: ``input_{i}``, ``input_{kw}``, ``output``/``output_{i}``..."""
    out: list[tuple[str, dict]] = []
    for i, arg in enumerate(value.get("input_args") or ()):
        _flatten(f"input_{i}", arg, out)
    for kw, arg in (value.get("input_kwargs") or {}).items():
        _flatten(f"input_{kw}", arg, out)
    outputs = value.get("output")
    if isinstance(outputs, list) and len(outputs) == 1:
        _flatten("output", outputs[0], out)
    elif outputs is not None:
        _flatten("output", outputs, out)
    return out


def _flatten(prefix: str, item: Any, out: list[tuple[str, dict]]) -> None:
    if isinstance(item, dict):
        if "dtype" in item and "shape" in item and str(item.get("type", "")).endswith("Tensor"):
            out.append((prefix, item))
        elif "type" not in item:
            for key, sub in item.items():
                _flatten(f"{prefix}_{key}", sub, out)
    elif isinstance(item, list):
        for i, sub in enumerate(item):
            _flatten(f"{prefix}_{i}", sub, out)
