"""Reader for msit torch dumps: ``msit_dump_*/torch_tensors/{device}_{pid}/{token}/{node}/*.pth``.

msit's ``model_tree.json`` carries no execution order (its ``order`` field is never filled), so
the completion order at a token is derived from the files' modification times (ns), ties broken
by the tree's post-order (children before parents, siblings in declaration order). ``.pth``
files are read without torch (:mod:`.pth`); statistics-only dumps (``statistics.csv`` per node
directory) become records without a locator.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path

import numpy as np
from layerwatch.capture.errors import LayerwatchError
from layerwatch.capture.framing import whole_lines
from layerwatch.engine.readers.base import (
    RankIndex,
    ReaderUpdate,
    TokenDirReader,
    is_rank_dir_name,
    is_tmp_name,
    scandir,
    skipped_note,
)
from layerwatch.engine.readers.load import canonical_dtype, load_array
from layerwatch.engine.readers.locate import TREE, _is_token
from layerwatch.engine.readers.locate import locate_msit as locate
from layerwatch.engine.readers.pth import PthIncomplete, pth_locator
from layerwatch.engine.records import Locator, Stats, TensorKey, TensorRecord, Topology

TENSOR_EXT = (".pth", ".pt", ".npy")
_TIME_PATH = itemgetter(3, 0)
"""A scanned file's (mtime, path): its key in time order (a C call, not a lambda)."""
STATS_CSV = "statistics.csv"
_STALE_NS = 5_000_000_000
"""A file that is still incomplete this long after its last change is reported, not waited for."""


_PATH_ORDER_MIN_NODES = 8
"""Below this many modules at a token, times in path order may be a real execution."""


@dataclass(slots=True)
class _Token:
    order: dict[str, int] = field(default_factory=dict)
    """Completion order of each node seen so far."""
    has_ids: bool = False
    id_candidates: list[tuple[int, str, Locator]] = field(default_factory=list)


@dataclass(slots=True)
class _Rank:
    path: Path
    rank: int
    tree_sig: tuple[int, int] | None = None
    post: dict[str, int] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    tokens: dict[int, _Token] = field(default_factory=dict)
    ordered_topology: bool = False
    times_noted: bool = False
    """The note that this rank's file times do not follow execution was given."""


class MsitReader(TokenDirReader):
    """Reads msit torch dumps (any of the directories msit itself accepts)."""

    fmt = "msit"

    def __init__(self, root: Path) -> None:
        self.root = root
        where = locate(root)
        if where is None:
            raise LayerwatchError(f"{root} is not an msit torch dump")
        self._tensors_dir = where.tensors_dir
        self._fixed_ranks = list(where.ranks) if where.ranks is not None else None
        self._only_token = where.token
        self._index = RankIndex()
        self._ranks: dict[str, _Rank] = {}
        self._seen: set[str] = set()
        """Files already turned into records (or reported)."""
        self._keys: set[TensorKey] = set()
        self._pending: dict[str, int] = {}
        """Incomplete files (path → first time seen incomplete, ns): retried on every poll."""
        self._topology: Topology | None = None
        """``poll_chunk``: the tokens still to read, last first."""

    # --- polling -------------------------------------------------------------------------
    def poll(self, changed: Sequence[Path] | None = None, *, final: bool = False) -> ReaderUpdate:
        update = ReaderUpdate()
        if self._gone(update):
            return update
        files: dict[tuple[str, int], list[tuple[str, str, int]]] = {}
        if changed is None:
            for state in self._discover():
                self._read_tree(state, update)
                for token_dir in self._token_dirs(state):
                    self._scan_token(state, token_dir, files)
                self._scan_weights(state, update)
        else:
            for path in changed:
                self._on_change(Path(os.path.abspath(path)), files, update)
        for pending in list(self._pending):
            self._retry(pending, files)
        self._emit(files, update, full=changed is None, final=final)
        return update

    def poll_chunk(self, limit: int) -> ReaderUpdate | None:
        """The next token of every rank of a finished dump, or None after the last (the first
        call also reads the trees and weights): msit writes a directory per token, so
        ``compare`` reads a long run a window of tokens at a time instead of holding every
        record (``engine/session/windowed.py``). Records, notes and order are those of
        ``poll(None, final=True)`` for that token; ``limit`` is not needed (a token is read
        whole)."""
        update = ReaderUpdate()
        token = self._next_chunk_token(update, self._read_rank_once)
        if token is None:
            return update if update else None
        self._seen.clear()  # keys and paths carry their token: no later token repeats them
        self._keys.clear()
        files: dict[tuple[str, int], list[tuple[str, str, int]]] = {}
        for state in self._ranks.values():
            self._scan_token(state, state.path / str(token), files)
        self._emit(files, update, full=True, final=True)
        return update

    def _read_rank_once(self, state: _Rank, update: ReaderUpdate) -> None:
        """What ``poll_chunk`` reads of a rank before its tokens: the model tree, the weights."""
        self._read_tree(state, update)
        self._scan_weights(state, update)

    def forget_before(self, token: int) -> None:
        """A windowed compare judged the tokens before ``token``: drop their execution orders
        (kept for the first token, whose order the topology took)."""
        for state in self._ranks.values():
            first = min(state.tokens, default=None)
            for old in [t for t in state.tokens if first < t < token]:  # type: ignore[operator]
                del state.tokens[old]

    def count_tensors(self) -> tuple[int, int]:
        """(tensors, tokens) of a finished dump, estimated from its first token's files (every
        token of a decode dumps the same modules): the memory check before a compare."""
        ranks = self._discover()
        tokens = {t for state in ranks for t in self._tokens(state)}
        if not tokens:
            return 0, 0
        first = min(tokens)
        files = 0
        for state in ranks:
            for node in scandir(state.path / str(first)):
                if node.is_dir():
                    files += sum(1 for e in scandir(node.path) if e.name.endswith(TENSOR_EXT))
        return files * len(tokens), len(tokens)

    def _discover(self) -> list[_Rank]:
        names = self._fixed_ranks
        if names is None:
            names = [
                e.name
                for e in scandir(self._tensors_dir)
                if e.is_dir() and is_rank_dir_name(e.name)
            ]
        self._index.assign(names)
        for name in names:
            if name not in self._ranks:
                self._ranks[name] = _Rank(self._tensors_dir / name, self._index(name))
        return [self._ranks[n] for n in names]

    def _token_dirs(self, state: _Rank) -> list[Path]:
        if self._only_token is not None:
            return [state.path / str(self._only_token)]
        return sorted(
            (Path(e.path) for e in scandir(state.path) if e.is_dir() and _is_token(e.name)),
            key=lambda p: int(p.name),
        )

    def _scan_token(self, state: _Rank, token_dir: Path, files: dict) -> None:
        token = int(token_dir.name)
        key = (state.path.name, token)
        bucket = files.get(key)
        for node in scandir(token_dir):
            if node.is_dir():
                if bucket is None:  # as a node directory's scan makes it (even an empty one)
                    bucket = files[key] = []
                self._scan_node(state, token, node.path, files, node.name, bucket)

    def _scan_node(
        self,
        state: _Rank,
        token: int,
        node_dir: str | Path,
        files: dict,
        node: str | None = None,
        bucket: list | None = None,
    ) -> None:
        """Add the node directory's tensor files (and ``statistics.csv``) to ``files``;
        ``node`` and ``bucket``, the directory's name and its ``files`` list, when the caller
        has them (:meth:`_scan_token`, ~930 directories a side on bench case (b))."""
        if node is None:
            node = os.path.basename(node_dir)
        if bucket is None:
            bucket = files.setdefault((state.path.name, token), [])
        seen = self._seen
        for entry in scandir(node_dir):
            name = entry.name
            if (
                (name.endswith(TENSOR_EXT) or name == STATS_CSV)
                and (not seen or entry.path not in seen)
                and not is_tmp_name(name)
            ):
                try:
                    st = entry.stat()
                except OSError:
                    continue
                bucket.append((entry.path, node, name, st.st_mtime_ns, st.st_size))

    def _add_file(self, state: _Rank, token: int, path: str, name: str, files: dict) -> None:
        if path in self._seen or is_tmp_name(name):
            return
        if not (name.endswith(TENSOR_EXT) or name == STATS_CSV):
            return
        try:
            st = os.stat(path)
        except OSError:
            return
        node = os.path.basename(os.path.dirname(path))
        files.setdefault((state.path.name, token), []).append(
            (path, node, name, st.st_mtime_ns, st.st_size)
        )

    def _on_change(self, path: Path, files: dict, update: ReaderUpdate) -> None:
        try:
            rel = path.relative_to(self._tensors_dir).parts
        except ValueError:
            return
        if not rel:
            for state in self._discover():
                self._read_tree(state, update)
                for token_dir in self._token_dirs(state):
                    self._scan_token(state, token_dir, files)
            return
        if self._fixed_ranks is not None and rel[0] not in self._fixed_ranks:
            return
        if not is_rank_dir_name(rel[0]):
            return
        state = self._ranks.get(rel[0]) or self._add_rank(rel[0])
        if state.tree_sig is None and not (len(rel) == 2 and rel[1] == TREE):
            self._read_tree(state, update)  # one stat until msit has written a parseable tree
        if len(rel) == 1:
            self._read_tree(state, update)
            for token_dir in self._token_dirs(state):
                self._scan_token(state, token_dir, files)
        elif rel[1] == TREE:
            self._read_tree(state, update)
        elif rel[1] == "weights":
            self._scan_weights(state, update)
        elif _is_token(rel[1]):
            token = int(rel[1])
            if self._only_token is not None and token != self._only_token:
                return
            if len(rel) == 2:
                self._scan_token(state, path, files)
            elif len(rel) == 3:
                self._scan_node(state, token, path, files)
            elif len(rel) == 4:
                self._add_file(state, token, str(path), rel[3], files)

    def _add_rank(self, name: str) -> _Rank:
        self._index.assign([name])
        state = self._ranks[name] = _Rank(self._tensors_dir / name, self._index(name))
        return state

    def _retry(self, path: str, files: dict) -> None:
        parts = Path(path).relative_to(self._tensors_dir).parts
        state = self._ranks.get(parts[0])
        if state is not None and len(parts) == 4:
            self._add_file(state, int(parts[1]), path, parts[3], files)

    # --- records -----------------------------------------------------------------------------
    def _emit(self, files: dict, update: ReaderUpdate, *, full: bool, final: bool = False) -> None:
        now = time.time_ns()
        for (rank_name, token), items in files.items():
            state = self._ranks[rank_name]
            tok = state.tokens.setdefault(token, _Token())
            # Nodes finish in mtime order; the tree's post-order breaks ties (coarse clocks).
            first: dict[str, int] = {}
            for _path, node, _name, mtime, _size in items:
                if node not in first or mtime < first[node]:
                    first[node] = mtime
            if full and state.post and not self._times_follow_execution(items):
                # Copied without its times (git clone, cp/scp without -p): the tree decides.
                first = dict.fromkeys(first, 0)
                if not state.times_noted:
                    state.times_noted = True
                    update.notes.append(
                        f"{state.path}: file times do not follow execution (copied without "
                        "preserving times?): execution order taken from model_tree.json"
                    )
            for node in sorted(
                (n for n in first if n not in tok.order),
                key=lambda n: (first[n], self._post_index(state, n), n),
            ):
                tok.order[node] = len(tok.order)
            order = tok.order
            items.sort(key=lambda i: (order[i[1]], i[2]))
            seen, keys, tensors = self._seen, self._keys, update.tensors
            for path, node, name, mtime, size in items:
                if path in seen:
                    continue
                loc: Locator | None = None
                records: list[TensorRecord] = []
                try:
                    if name == STATS_CSV:
                        records, torn = self._stats_records(state, token, node, path)
                        if torn and final:  # the run is over: the line will not be finished
                            update.notes.append(f"{path}: last line cut short, skipped")
                    else:
                        loc = (
                            npy_locator(path) if name.endswith(".npy") else pth_locator(path, size)
                        )
                except PthIncomplete:
                    since = self._pending.setdefault(path, now)
                    if final or (full and now - max(since, mtime) > _STALE_NS):
                        # The writer finished (or left it for long): it will not grow any more.
                        update.notes.append(skipped_note(path))
                        seen.add(path)
                        self._pending.pop(path, None)
                    continue
                except LayerwatchError as exc:
                    update.notes.append(str(exc))
                    seen.add(path)
                    self._pending.pop(path, None)
                    continue
                seen.add(path)
                if self._pending:
                    self._pending.pop(path, None)
                node_order = order[node]
                if loc is not None:  # a tensor file: its one record, built here (no list)
                    key = TensorKey(token, node, name.rsplit(".", 1)[0], state.rank)
                    if key in keys:
                        continue
                    keys.add(key)
                    tensors.append(
                        TensorRecord(
                            key,
                            loc.dtype,
                            loc.shape,
                            loc,
                            None,
                            node_order,
                            state.types.get(node, ""),
                            path,
                        )
                    )
                    if key.stem == "input_0":
                        tok.id_candidates.append((node_order, loc.dtype, loc))
                    continue
                for record in records:  # statistics.csv: a record a row
                    if record.key in keys:
                        continue
                    keys.add(record.key)
                    record.order = node_order
                    tensors.append(record)
            self._token_ids(tok, token, update)
            if not state.ordered_topology and self._topology is not None and tok.order:
                for node, position in tok.order.items():
                    if node in self._topology.nodes:
                        self._topology.nodes[node].order = position
                state.ordered_topology = True
                update.topology = self._topology

    def _stats_records(
        self, state: _Rank, token: int, node: str, path: str
    ) -> tuple[list[TensorRecord], bool]:
        """A statistics-only node directory's ``statistics.csv``: a record a row, no locator;
        and whether a last line is not finished (being written, or cut short)."""
        node_type = state.types.get(node, "")
        with open(path, "rb") as fh:
            text = fh.read()
        whole = whole_lines(text)
        if not whole:
            raise PthIncomplete(f"{path}: empty statistics")
        torn = whole < len(text)
        rows = list(csv.DictReader(io.StringIO(text[:whole].decode("utf-8", "replace"))))
        outputs = sum(1 for r in rows if r.get("InputOutput", "").lower() == "output")
        if torn and outputs:  # rows after the outputs are outputs: a lone one is output_0
            outputs += 1
        out: list[TensorRecord] = []
        seen: set[str] = set()
        for row in rows:
            part = "input" if row.get("InputOutput", "").lower() == "input" else "output"
            index = row.get("Index", "0") or "0"
            stem = "output" if part == "output" and outputs == 1 else f"{part}_{index}"
            while stem in seen:
                stem += "_"
            seen.add(stem)
            shape = tuple(
                int(d) for d in row.get("Shape", "()").strip("()[] ").split(",") if d.strip()
            )
            high, low, mean, norm = (
                float(row.get(k, "nan") or "nan") for k in ("Max", "Min", "Mean", "L2Norm")
            )
            stats = Stats(high, low, mean, norm)
            dtype = canonical_dtype(row.get("DataType", "float32"))
            key = TensorKey(token, node, stem, state.rank)
            out.append(TensorRecord(key, dtype, shape, None, stats, -1, node_type, path))
        # The csv grows while the run writes it: re-read it whole next time it changes.
        self._seen.discard(path)
        return out, torn

    def _token_ids(self, tok: _Token, token: int, update: ReaderUpdate) -> None:
        if tok.has_ids or not tok.id_candidates:
            return
        for _order, dtype, loc in sorted(tok.id_candidates, key=lambda c: c[0]):
            if dtype in ("int64", "int32", "int16", "uint8", "int8", "uint16", "uint32", "uint64"):
                try:
                    ids = load_array(loc).reshape(-1)
                except LayerwatchError:
                    continue
                update.token_ids[token] = tuple(int(i) for i in ids)
                tok.has_ids = True
                return

    def _times_follow_execution(self, items: list) -> bool:
        """Whether the files' times can be the order msit wrote them in.

        msit writes a module's files in its forward hook, after its children finished, so in a
        dump with its original times no module is older than a child of it. A copy that did not
        keep the times fails this (``cp -r``/``scp -r`` write in directory order) or writes the
        files in path order (git checkouts, ``rsync`` without ``-t``): times in exact path order
        over several modules are not an execution (no model runs q, k, v in name order).
        """
        last: dict[str, int] = {}
        for _path, node, _name, mtime, _size in items:
            if mtime > last.get(node, -1):
                last[node] = mtime
        nodes = self._topology.nodes if self._topology is not None else {}
        for node, mtime in last.items():
            parent = nodes[node].parent if node in nodes else node.rpartition(".")[0]
            while parent:
                if parent in last:
                    if last[parent] < mtime:
                        return False
                    break
                parent = nodes[parent].parent if parent in nodes else parent.rpartition(".")[0]
        if len(last) >= _PATH_ORDER_MIN_NODES:
            by_time = [item[0] for item in sorted(items, key=_TIME_PATH)]
            if by_time == sorted(by_time):
                return False
        return True

    def _post_index(self, state: _Rank, node: str) -> float:
        if node in state.post:
            return state.post[node]
        parent = node.rsplit(".", 1)[0] if "." in node else ""
        # An API folder (``{module}.{api}``) finishes inside its module: just before it.
        return state.post.get(parent, len(state.post)) - 0.5

    # --- tree and weights ----------------------------------------------------------------------
    def _read_tree(self, state: _Rank, update: ReaderUpdate) -> None:
        path = state.path / TREE
        try:
            st = path.stat()
            sig = (st.st_mtime_ns, st.st_size)
            if sig == state.tree_sig:
                return
            tree = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return  # absent, or being rewritten (msit rewrites it during token 0): next poll
        state.tree_sig = sig
        topology = Topology(root=str(tree.get("name", "root")))
        post: list[str] = []

        def walk(item: dict, parent: str | None) -> None:
            name = str(item.get("name", ""))
            topology.add(name, str(item.get("type", "")), parent)
            state.types[name] = str(item.get("type", ""))
            for child in item.get("children", ()):
                if isinstance(child, dict):
                    walk(child, name)
            post.append(name)

        walk(tree, None)
        state.post = {name: i for i, name in enumerate(post)}
        self._topology = topology
        state.ordered_topology = False
        first = min(state.tokens) if state.tokens else None
        if first is not None and state.tokens[first].order:
            for node, order in state.tokens[first].order.items():
                if node in topology.nodes:
                    topology.nodes[node].order = order
            state.ordered_topology = True
        update.topology = topology

    def _scan_weights(self, state: _Rank, update: ReaderUpdate) -> None:
        for entry in scandir(state.path / "weights"):
            if entry.path in self._seen or not entry.name.endswith(TENSOR_EXT):
                continue
            try:
                loc = pth_locator(entry.path)
            except PthIncomplete:
                continue
            except LayerwatchError as exc:
                update.notes.append(str(exc))
            else:
                update.weights[entry.name.rsplit(".", 1)[0]] = loc
            self._seen.add(entry.path)


def npy_locator(path: str) -> Locator:
    """A locator for a ``.npy`` file's payload (C or Fortran order)."""
    try:
        with open(path, "rb") as fh:
            fmt = np.lib.format
            major, _ = fmt.read_magic(fh)
            read = fmt.read_array_header_1_0 if major == 1 else fmt.read_array_header_2_0
            shape, fortran, dtype = read(fh)
            offset = fh.tell()
    except FileNotFoundError:
        raise LayerwatchError(f"{path}: file not found") from None
    except (OSError, ValueError) as exc:
        raise PthIncomplete(f"{path}: unreadable .npy header ({exc})") from None
    name = canonical_dtype(np.dtype(dtype).name)
    size = os.path.getsize(path) - offset
    need = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if size < need:
        raise PthIncomplete(f"{path}: truncated .npy")
    strides = None
    if fortran and len(shape) > 1:
        acc, out = 1, []
        for d in shape:
            out.append(acc)
            acc *= d
        strides = tuple(out)
    return Locator(path, offset, need, name, tuple(shape), strides)
