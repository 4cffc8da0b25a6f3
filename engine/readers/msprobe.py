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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.readers.base import (
    RankIndex,
    ReaderUpdate,
    cut_short_note,
    scandir,
    skipped_note,
)
from layerwatch.engine.readers.json_stream import read_cut
from layerwatch.engine.readers.load import canonical_dtype, load_array
from layerwatch.engine.readers.locate import _RANK, _STEP, DUMP
from layerwatch.engine.readers.locate import locate_msprobe as locate
from layerwatch.engine.readers.msprobe_tokens import (
    RankCalls,
    assign_tokens,
    module_parts,
    unused_note,
)
from layerwatch.engine.readers.pth import PthIncomplete, pth_locator
from layerwatch.engine.records import Locator, Stats, TensorKey, TensorRecord, Topology

CONSTRUCT = "construct.json"
DATA_DIR = "dump_tensor_data"
_API = re.compile(r"^(.+)\.(\d+)\.forward$")
_INTS = ("int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64")
NO_MODULES = "no module entries (level L1?): every call is put in token 0"


@dataclass(slots=True)
class _RankState:
    path: Path
    rank: int
    sig: tuple[int, int] | None = None
    pending: set[TensorKey] = field(default_factory=set)


@dataclass(slots=True)
class _Walk:
    """Where one rank's read stands: the step's token offset, the token being read, its API
    counters and completion order, the tensors already taken."""

    state: _RankState
    offset: int
    data_dir: Callable[[], Path | None]
    """msprobe's ``dump_data_dir`` (where payloads are when not beside dump.json)."""
    keys: set[TensorKey]
    per_token: bool = False
    """``keys`` hold one token's (a stream never sees a token again)."""
    token: int = -1
    counters: dict[tuple[int, str, str], int] = field(default_factory=dict)
    order: int = -1


@dataclass(slots=True)
class _Streams:
    """``poll_chunk``'s place: the steps still to read, the open step's ranks as streams."""

    steps: list[Path]
    ranks: list[tuple[RankCalls, _Walk]] = field(default_factory=list)
    offset: int = 0
    local: int = 0
    topology: Topology = field(default_factory=lambda: Topology(root="root"))


class MsprobeReader:
    """Reads msprobe PyTorch dumps (tensor or statistics)."""

    fmt = "msprobe"
    live_chunks = False
    """``poll_chunk`` is ``compare``'s alone: it keeps no key of the tokens it handed out, so
    the live session (engine/live/side.py) reads msprobe dumps with ``poll``."""

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
        self._streams: _Streams | None = None

    def watch_roots(self) -> list[Path]:
        return [self.root if self.root.is_dir() else self.root.parent]

    def poll(self, changed: Sequence[Path] | None = None, *, final: bool = False) -> ReaderUpdate:
        update = ReaderUpdate()
        if self._gone(update):
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

    # --- compare's windows: a token of every rank at a time --------------------------------
    def poll_chunk(self, limit: int) -> ReaderUpdate | None:
        """The next token of every rank of the step being read, each ``dump.json`` parsed as a
        stream (engine/readers/msprobe_tokens.py): ``compare`` holds a window's records, not a
        step's (engine/session/windowed.py). None after the last. ``limit`` is not used: a
        token is the unit. Cut or corrupt JSON is a :class:`LayerwatchError` where it is met."""
        if self._streams is None:
            update = ReaderUpdate()
            self._streams = _Streams([] if self._gone(update) else self._steps())
            if update.notes:
                return update
        at = self._streams
        while True:
            if not at.ranks and not self._open_step(at):
                return None
            update = ReaderUpdate()
            added = False
            for calls, walk in at.ranks:
                if calls.peek() != at.local:
                    continue
                got = calls.next_token()
                assert got is not None
                if at.local == 0 and calls.done and calls.splitter.modules == 0:
                    self._note(f"{walk.state.path}: {NO_MODULES}", update)
                for (name, value, parent), _ in got[1]:
                    added |= self._entry(
                        walk, at.local, name, value, parent, update, at.topology, True
                    )
            at.local += 1
            if all(calls.peek() is None for calls, _ in at.ranks):
                self._close_step(at, update)
            if added:
                update.topology = at.topology
            if update.tensors or update.notes or update.token_ids or update.topology:
                return update

    def _gone(self, update: ReaderUpdate) -> bool:
        """``True`` when the dump directory is gone (with a note the first time)."""
        if self.root.exists():
            return False
        if not self._gone_noted:
            update.notes.append(f"{self.root}: dump directory disappeared")
            self._gone_noted = True
        return True

    def _open_step(self, at: _Streams) -> bool:
        """Streams over the next step's ranks; False when no step is left."""
        while at.steps and not at.ranks:
            step = at.steps.pop(0)
            at.local = 0
            for rank_dir in self._rank_dirs(step):
                if not (rank_dir / DUMP).is_file():
                    continue  # as when read whole: a rank without its file is not there
                self._index.assign([rank_dir.name])
                state = _RankState(rank_dir, _rank_number(rank_dir.name, self._index))
                calls = RankCalls(rank_dir, DUMP, CONSTRUCT)
                walk = _Walk(state, at.offset, _late_data_dir(calls), set(), per_token=True)
                at.ranks.append((calls, walk))
        return bool(at.ranks)

    def _close_step(self, at: _Streams, update: ReaderUpdate) -> None:
        """Every rank of the step read: the next step's tokens come after its last."""
        for calls, _ in at.ranks:
            if calls.parents_note is not None:
                self._note(calls.parents_note, update)
            if calls.construct_cut is not None:
                self._note(_cut_note(calls.path.parent / CONSTRUCT, *calls.construct_cut), update)
            elif calls.cut is not None:
                self._note(_cut_note(calls.path, calls.cut, calls.splitter.entries), update)
            elif not calls.has_data:
                self._note(skipped_note(calls.path), update)
        at.offset += max((calls.splitter.tokens for calls, _ in at.ranks), default=0)
        at.ranks = []

    def estimate(self) -> tuple[int, int]:
        """(tensors, tokens) of the dump without reading it: the first rank's first token
        counted, scaled by the size of every ``dump.json`` (``compare``'s memory check)."""
        steps = [
            [r / DUMP for r in self._rank_dirs(s) if (r / DUMP).is_file()] for s in self._steps()
        ]
        sizes = [[f.stat().st_size for f in files] for files in steps]
        first = next((files[0] for files in steps if files), None)
        if first is None:
            return 0, 0
        calls = RankCalls(first.parent, DUMP, CONSTRUCT)
        got = calls.next_token()
        if got is None:
            return 0, 0
        counters: dict[tuple[int, str, str], int] = {}
        tensors = sum(
            len(_leaves(value))
            for (name, value, parent), _ in got[1]
            if _node_name(name, parent, counters, 0)[0] is not None
        )
        per_token = max(1, got[1][-1][1])
        scale = sum(map(sum, sizes)) / per_token
        tokens = sum(max(s, default=0) for s in sizes) / per_token
        return round(tensors * scale), max(1, round(tokens))

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
            # Being written now (a live read waits for the whole file), or never to be whole:
            # a file cut short keeps its complete calls, a corrupt one is skipped.
            cut = _read_cut(path, "data") if final else None
            if cut is None:
                if final:
                    self._note(skipped_note(path), update)
                return self._tokens_in_step.get(str(state.path), 0), False
            dump, at = cut
            data = dump["data"]
            dump_cut: int | None = at
        else:
            dump_cut = None
        construct_cut: int | None = None
        try:
            construct = json.loads((state.path / CONSTRUCT).read_bytes())
        except OSError:
            construct = {}
        except ValueError:
            if not final:  # being written (as dump.json is waited for): read it when whole
                return self._tokens_in_step.get(str(state.path), 0), False
            # cut short: the parents it has; a corrupt one: none known
            cut = _read_cut(state.path / CONSTRUCT)
            construct, construct_cut = cut if cut is not None else ({}, None)
        if not isinstance(construct, dict):  # JSON, but not the object of calls it should be
            construct = {}
        if not construct:
            unused = unused_note(state.path / CONSTRUCT, whole=True)
            if unused is not None:
                self._note(unused, update)
        state.sig = sig
        entries = [(name, value) for name, value in data.items() if isinstance(value, dict)]
        lacking = None
        if construct and construct_cut is not None:
            lacking = next((i for i, (n, _) in enumerate(entries) if n not in construct), None)
        if lacking is not None and construct_cut is not None:
            # The calls from the first one construct.json lacks have no known place in the
            # tree (their token, an API's name): not read, as if dump.json ended there.
            entries = entries[:lacking]
            self._note(_cut_note(state.path / CONSTRUCT, construct_cut, lacking), update)
        elif dump_cut is not None:
            self._note(_cut_note(path, dump_cut, len(entries)), update)
        tokens, n_tokens, settled = assign_tokens(entries, construct or {})
        if not full:
            entries = entries[:settled]
        if entries and not any(module_parts(name) for name, _ in entries):
            self._note(f"{state.path}: {NO_MODULES}", update)
        added = False
        data_dir = _data_dir(dump.get("dump_data_dir"))
        walk = _Walk(state, offset, lambda: data_dir, self._keys)
        state.pending.clear()
        for i, (name, value) in enumerate(entries):
            parent = construct.get(name) if construct else None
            added |= self._entry(walk, tokens[i], name, value, parent, update, topo, final)
        return n_tokens, added

    def _note(self, note: str, update: ReaderUpdate) -> None:
        """A note of the dump, once."""
        if note not in self._notes:
            self._notes.add(note)
            update.notes.append(note)

    def _entry(
        self,
        walk: _Walk,
        local: int,
        name: str,
        value: dict,
        parent: Any,
        update: ReaderUpdate,
        topo: Topology,
        final: bool,
    ) -> bool:
        """One call of a rank (``local``: its token in the step): its node in ``topo``, its
        tensors and weights into ``update``; True when the node is new."""
        state = walk.state
        token = local + walk.offset
        if token != walk.token:  # counters and completion order start again each token
            walk.token = token
            walk.counters.clear()
            walk.order = -1
            if walk.per_token:
                walk.keys.clear()
        node, node_type, parent_node = _node_name(name, parent, walk.counters, local)
        if node is None:
            return False
        added = node not in self._topology_nodes
        self._topology_nodes.add(node)
        walk.order += 1
        topo.add(node, node_type, parent_node, walk.order if token == 0 else -1)
        local_data = state.path / DATA_DIR
        for stem, leaf in _leaves(value):
            self._leaf(
                state, token, node, node_type, stem, leaf, walk.order, local_data, walk.data_dir,
                update, walk.keys, final,
            )  # fmt: skip
        for pname, leaf in (value.get("parameters") or {}).items():
            wname = f"{node}.{pname}"
            if wname in self._weights or not isinstance(leaf, dict) or not leaf.get("data_name"):
                continue
            try:
                update.weights[wname] = pth_locator(local_data / str(leaf["data_name"]))
                self._weights.add(wname)
            except LayerwatchError:
                continue
        return added

    def _leaf(
        self, state: _RankState, token: int, node: str, node_type: str, stem: str, leaf: dict,
        order: int, local_data: Path, data_dir: Callable[[], Path | None], update: ReaderUpdate,
        keys: set[TensorKey], final: bool = False,
    ) -> None:  # fmt: skip
        key = TensorKey(token, node, stem, state.rank)
        if key in keys:
            return
        try:
            dtype = canonical_dtype(str(leaf.get("dtype", "float32")))
        except LayerwatchError as exc:
            update.notes.append(f"{state.path}: {node} {stem}: {exc}")
            keys.add(key)
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
            if not file.exists() and (elsewhere := data_dir()) is not None:
                file = elsewhere / str(data_name)
            try:
                loc = pth_locator(file)
                source = str(file)
            except PthIncomplete:
                if final:  # the writer finished: it will never be whole
                    update.notes.append(skipped_note(file))
                    keys.add(key)
                    return
                state.pending.add(key)
                return
            except LayerwatchError as exc:
                update.notes.append(str(exc))
                keys.add(key)
                return
        keys.add(key)
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


def _read_cut(path: Path, nested: str | None = None) -> tuple[dict[str, Any], int] | None:
    """A JSON object ``json.loads`` refused, read as far as it is whole: (its complete entries,
    those of ``nested`` as an object under that key, where the file ends) when it is cut short
    and nothing else is wrong; None when it is corrupt (or cannot be read)."""
    cut = read_cut(path, nested)
    if cut is None:
        return None
    entries, at = cut
    outer: dict[str, Any] = {}
    inner: dict[str, Any] = {}
    for where, name, value in entries:
        if where is None:
            outer.setdefault(name, value)
        else:
            inner[name] = value
    if nested is not None:
        if nested in outer and not isinstance(outer[nested], dict):
            return None
        outer[nested] = inner
    return outer, at


def _cut_note(path: Path, at: int, calls: int) -> str:
    """:func:`~.base.cut_short_note` for a rank's ``dump.json`` or ``construct.json`` (the
    calls read before the cut; ``step0 rank0`` is the rest)."""
    rest = f"{path.parent.parent.name} {path.parent.name}"
    return cut_short_note(path, at, f"{calls} complete calls", rest)


def _late_data_dir(calls: RankCalls) -> Callable[[], Path | None]:
    """msprobe's ``dump_data_dir`` of a streamed rank, looked up when a payload is not beside
    dump.json (msprobe writes it before ``data``; read to the end for it otherwise)."""
    return lambda: _data_dir(calls.late_head("dump_data_dir"))


def _data_dir(value: Any) -> Path | None:
    return Path(str(value)) if value else None


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


def _node_name(
    name: str, parent: Any, counters: dict[tuple[int, str, str], int], token: int
) -> tuple[str | None, str, str | None]:
    """(node, node type, parent node) of a forward entry (``parent``: its construct.json
    parent); ``None`` for backward/grad entries."""
    parts = module_parts(name)
    if parts is not None:
        path, cls = parts
        node = f"root.{path}" if path else "root"
        parent_parts = module_parts(parent) if isinstance(parent, str) else None
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
    parent_parts = module_parts(parent) if isinstance(parent, str) else None
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
