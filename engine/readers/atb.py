"""Reader for ATB dumps written by ``msit llm dump`` (the CANN probe):

``{dump}/tensors/{device_id}_{pid}/{executeCount}/{order}_{OpType}/[{order}_{Child}/...]/
{before|after}/{intensor|outtensor}{i}.bin`` + ``{dump}/model/{pid}/*.json`` topology.

Node names are ``root`` + the dotted op-directory path (``root.3_Decoder.1_LinearOperation``);
``intensor{i}`` → ``input_{i}`` (``before/`` preferred), ``outtensor{i}`` → ``output_{i}``
(``after/`` preferred). ATB runs a child op before its parent finishes, so the completion order
is the post-order of the op tree, computed from the directory path alone (stable for live
reading): see :func:`structural_order`.
"""

from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.readers.atb_bin import NZ_FORMATS, BinIncomplete, read_header
from layerwatch.engine.readers.base import (
    RankIndex,
    ReaderUpdate,
    TokenDirReader,
    is_rank_dir_name,
    is_tmp_name,
    scandir,
    skipped_note,
)
from layerwatch.engine.readers.load import itemsize, load_array
from layerwatch.engine.readers.locate import _OP_DIR
from layerwatch.engine.readers.locate import locate_atb as locate
from layerwatch.engine.records import Locator, Stats, TensorKey, TensorRecord, Topology

_TENSOR = re.compile(r"^(intensor|outtensor)(\d+)\.bin$")
_DEPTH = 6
_BASE = 1000
_INTS = ("int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64")


def structural_order(op_path: Sequence[str]) -> int:
    """Post-order key of an op from its directory path: children before parents, siblings by
    their ``{order}_`` prefix. Read as decimal groups of three digits (``002 003 999 000…``)."""
    digits = [min(int(_OP_DIR.match(p).group(1)), _BASE - 2) for p in op_path[: _DEPTH - 1]]  # type: ignore[union-attr]
    digits.append(_BASE - 1)
    digits += [0] * (_DEPTH - len(digits))
    value = 0
    for d in digits:
        value = value * _BASE + d
    return value


@dataclass(slots=True)
class _Rank:
    path: Path
    rank: int
    pid: str
    topo_sig: tuple = ()
    op_names: dict[str, str] = field(default_factory=dict)
    """Node name → topology ``opName`` (to look up shapes in operation_io csv files)."""
    io_shapes: dict[int, dict[str, dict[str, list[tuple[int, ...]]]]] = field(default_factory=dict)
    """Token → operation name → ``input``/``output`` → shapes (``operation_tensors_{token}.csv``)."""
    ids_found: set[int] = field(default_factory=set)


class AtbReader(TokenDirReader):
    """Reads ATB ``.bin`` dumps incrementally."""

    fmt = "atb"

    def __init__(self, root: Path, nd_shapes: Mapping[str, tuple[int, ...]] | None = None) -> None:
        self.root = root
        where = locate(root)
        if where is None:
            raise LayerwatchError(f"{root} is not an ATB dump")
        self._where = where
        self._nd_shapes = dict(nd_shapes or {})
        """ND shapes of FRACTAL_NZ tensors: ``"{node}:{stem}"`` or ``"{node}"`` → shape."""
        self._index = RankIndex()
        self._ranks: dict[str, _Rank] = {}
        self._seen: set[str] = set()
        self._keys: set[TensorKey] = set()
        self._pending: dict[str, tuple[_Rank, int]] = {}
        """Files still being written (header or payload short): retried on every poll."""
        self._topology: Topology | None = None
        """``poll_chunk``: the execute counts still to read, last first."""

    # --- polling -------------------------------------------------------------------------
    def poll(self, changed: Sequence[Path] | None = None, *, final: bool = False) -> ReaderUpdate:
        update = ReaderUpdate()
        if self._gone(update):
            return update
        found: list[tuple[_Rank, int, str]] = []
        if changed is None:
            for state in self._discover():
                self._read_topology(state, update)
                for token_dir in self._token_dirs(state):
                    self._walk(state, int(token_dir.name), token_dir, found)
        else:
            for path in changed:
                self._on_change(Path(os.path.abspath(path)), found, update)
        found += [(state, token, path) for path, (state, token) in self._pending.items()]
        self._emit(found, update, final=final)
        return update

    def poll_chunk(self, limit: int) -> ReaderUpdate | None:
        """The next execute count (token) of every rank of a finished dump, or None after the
        last (the first call also reads the topology): ATB writes a directory per execute
        count, so ``compare`` reads a long run a window of tokens at a time
        (``engine/session/windowed.py``). Records and order are those of
        ``poll(None, final=True)`` for that token; ``limit`` is not needed (a token is read
        whole)."""
        update = ReaderUpdate()
        token = self._next_chunk_token(update, self._read_topology)
        if token is None:
            return update if update else None
        self._seen.clear()  # keys and paths carry their token: no later token repeats them
        self._keys.clear()
        found: list[tuple[_Rank, int, str]] = []
        for state in self._ranks.values():
            self._walk(state, token, state.path / str(token), found)
        self._emit(found, update, final=True)
        return update

    def forget_before(self, token: int) -> None:
        """A windowed compare judged the tokens before ``token``: drop their shape tables."""
        for state in self._ranks.values():
            for old in [t for t in state.io_shapes if t < token]:
                del state.io_shapes[old]

    def count_tensors(self) -> tuple[int, int]:
        """(tensors, tokens) of a finished dump, estimated from its first execute count's
        files (``before/``/``after/`` copies counted once): the memory check before a compare."""
        ranks = self._discover()
        tokens = {t for state in ranks for t in self._tokens(state)}
        if not tokens:
            return 0, 0
        found: list[tuple[_Rank, int, str]] = []
        for state in ranks:
            self._walk(state, min(tokens), state.path / str(min(tokens)), found)
        names = {(os.path.dirname(os.path.dirname(p)), os.path.basename(p)) for _, _, p in found}
        return len(names) * len(tokens), len(tokens)

    def _discover(self) -> list[_Rank]:
        names = list(self._where.ranks or ())
        if self._where.ranks is None:
            names = [
                e.name
                for e in scandir(self._where.tensors_dir)
                if e.is_dir() and is_rank_dir_name(e.name)
            ]
        self._index.assign(names)
        for name in names:
            if name not in self._ranks:
                pid = name.rsplit("_", 1)[-1]
                self._ranks[name] = _Rank(self._where.tensors_dir / name, self._index(name), pid)
        return [self._ranks[n] for n in names]

    def _token_dirs(self, state: _Rank) -> list[Path]:
        if self._where.token is not None:
            return [state.path / str(self._where.token)]
        dirs = [Path(e.path) for e in scandir(state.path) if e.is_dir() and e.name.isdigit()]
        return sorted(dirs, key=lambda p: int(p.name))

    def _walk(self, state: _Rank, token: int, directory: str | Path, found: list) -> None:
        for entry in scandir(directory):
            if entry.is_dir():
                self._walk(state, token, entry.path, found)
            elif (
                entry.name.endswith(".bin")
                and entry.path not in self._seen
                and not is_tmp_name(entry.name)
            ):
                found.append((state, token, entry.path))

    def _on_change(self, path: Path, found: list, update: ReaderUpdate) -> None:
        try:
            rel = path.relative_to(self._where.tensors_dir).parts
        except ValueError:
            if self._where.dump_dir is not None and path.is_relative_to(
                self._where.dump_dir / "model"
            ):
                for state in self._discover():
                    self._read_topology(state, update)
            return
        if not rel:
            for state in self._discover():
                self._read_topology(state, update)
                for token_dir in self._token_dirs(state):
                    self._walk(state, int(token_dir.name), token_dir, found)
            return
        if not is_rank_dir_name(rel[0]) or (
            self._where.ranks is not None and rel[0] not in self._where.ranks
        ):
            return
        known = self._ranks.get(rel[0])
        if known is None:
            self._index.assign([rel[0]])
            known = self._ranks[rel[0]] = _Rank(
                self._where.tensors_dir / rel[0], self._index(rel[0]), rel[0].rsplit("_", 1)[-1]
            )
            self._read_topology(known, update)
        state = known
        if len(rel) == 1:
            for token_dir in self._token_dirs(state):
                self._walk(state, int(token_dir.name), token_dir, found)
            return
        if not rel[1].isdigit() or (
            self._where.token is not None and int(rel[1]) != self._where.token
        ):
            return
        if path.suffix == ".bin":
            if str(path) not in self._seen and not is_tmp_name(path.name):
                found.append((state, int(rel[1]), str(path)))
        elif path.is_dir():
            self._walk(state, int(rel[1]), path, found)

    # --- records -----------------------------------------------------------------------------
    def _emit(
        self, found: list[tuple[_Rank, int, str]], update: ReaderUpdate, *, final: bool = False
    ) -> None:
        parsed = []
        for state, token, path in found:
            if path in self._seen:
                continue
            item = self._parse(state, token, path, update, final)
            if item is not None:
                parsed.append(item)
        # before/ wins for inputs, after/ for outputs: emit preferred files first.
        parsed.sort(key=lambda r: (r[0].key, not r[1]))
        for record, preferred in parsed:
            if record.key in self._keys:
                continue
            if not preferred and _counterpart(record.source) in self._pending:
                # The preferred copy (before/ for inputs) is still being written: wait for it.
                self._seen.discard(record.source)
                self._pending[record.source] = self._pending[_counterpart(record.source)]
                continue
            self._keys.add(record.key)
            update.tensors.append(record)
        for state in {id(s): s for s, _, _ in found}.values():
            self._token_ids(state, [r for r, _ in parsed if r.key.rank == state.rank], update)

    def _parse(
        self, state: _Rank, token: int, path: str, update: ReaderUpdate, final: bool = False
    ) -> tuple[TensorRecord, bool] | None:
        parts = path[len(str(state.path)) + len(str(token)) + 2 :].split(os.sep)
        match = _TENSOR.match(parts[-1]) if len(parts) >= 3 else None
        if (
            match is None
            or parts[-2] not in ("before", "after")
            or not all(_OP_DIR.match(p) for p in parts[:-2])
        ):
            self._seen.add(path)
            return None
        ops = parts[:-2]
        node = "root." + ".".join(ops)
        stem = ("input_" if match.group(1) == "intensor" else "output_") + match.group(2)
        preferred = (parts[-2] == "before") == (match.group(1) == "intensor")
        try:
            header = read_header(path)
        except BinIncomplete:
            if final:  # the writer finished: it will never be whole
                self._seen.add(path)
                self._pending.pop(path, None)
                update.notes.append(skipped_note(path))
                return None
            self._pending[path] = (state, token)  # still being written: retried next poll
            return None
        except LayerwatchError as exc:
            self._seen.add(path)
            self._pending.pop(path, None)
            update.notes.append(str(exc))
            return None
        self._seen.add(path)
        self._pending.pop(path, None)
        key = TensorKey(token, node, stem, state.rank)
        node_type = _OP_DIR.match(ops[-1]).group(2)  # type: ignore[union-attr]
        order = structural_order(ops)
        if header.is_stats:
            a = header.attrs
            high, low, mean, norm = (
                float(a.get(k, "nan")) for k in ("max", "min", "mean", "l2norm")
            )
            stats = Stats(high, low, mean, norm)
            return TensorRecord(
                key, header.dtype or "float32", header.dims, None, stats, order, node_type, path
            ), preferred
        dtype = header.dtype
        if dtype is None:
            update.notes.append(header.dtype_note())
            return None
        data = header.data
        if data is None:
            update.notes.append(f"{path}: description only (no tensor data); not compared")
            return None
        offset, length = data
        shape, loc = header.dims, None
        if length != _numel(shape) * itemsize(dtype):
            update.notes.append(
                f"{path}: payload is {length} bytes, dims {shape} need {_numel(shape) * itemsize(dtype)}"
            )
            return None
        if header.format in NZ_FORMATS:
            nd = self._nd_shape(state, token, node, stem, ops)
            if nd is not None and _numel(nd) <= _numel(shape):
                loc = Locator(path, offset, length, dtype, nd, None, 0, "nz", shape)
                shape = nd
            elif len(shape) in (3, 4):
                batch = shape[0] if len(shape) == 4 else 1
                n1, mp, n0 = shape[-3:]
                padded = (mp, n1 * n0) if batch == 1 else (batch, mp, n1 * n0)
                loc = Locator(path, offset, length, dtype, padded, None, 0, "nz", shape)
                update.notes.append(
                    f"{path}: FRACTAL_NZ tensor with unknown ND shape; un-blocked with padding to {padded}"
                )
                shape = padded
            else:
                update.notes.append(
                    f"{path}: FRACTAL_NZ tensor with unknown ND shape; compared as stored"
                )
        if loc is None:
            loc = Locator(path, offset, length, dtype, shape)
        return TensorRecord(key, dtype, shape, loc, None, order, node_type, path), preferred

    def _nd_shape(
        self, state: _Rank, token: int, node: str, stem: str, ops: Sequence[str]
    ) -> tuple[int, ...] | None:
        for key in (f"{node}:{stem}", node):
            if key in self._nd_shapes:
                return tuple(self._nd_shapes[key])
        op_name = state.op_names.get(node)
        if op_name is None:
            return None
        shapes = self._io_shapes(state, token).get(op_name)
        if not shapes:
            return None
        part, index = stem.split("_")
        table = shapes["input" if part == "input" else "output"]
        return table[int(index)] if int(index) < len(table) else None

    def _io_shapes(self, state: _Rank, token: int) -> dict[str, dict[str, list[tuple[int, ...]]]]:
        if token in state.io_shapes or self._where.dump_dir is None:
            return state.io_shapes.get(token, {})
        path = (
            self._where.dump_dir
            / "operation_io_tensors"
            / state.pid
            / f"operation_tensors_{token}.csv"
        )
        table: dict[str, dict[str, list[tuple[int, ...]]]] = {}
        try:
            with open(path, newline="") as fh:
                for row in csv.DictReader(fh, delimiter="|"):
                    table[row["OpName"]] = {
                        "input": [_shape(s) for s in (row.get("InShape") or "").split(";")],
                        "output": [_shape(s) for s in (row.get("OutShape") or "").split(";")],
                    }
        except (OSError, KeyError, ValueError, csv.Error):
            table = {}
        state.io_shapes[token] = table
        return table

    def _token_ids(self, state: _Rank, records: list[TensorRecord], update: ReaderUpdate) -> None:
        by_token: dict[int, list[TensorRecord]] = {}
        for r in records:
            if (
                r.key.token not in state.ids_found
                and r.key.part == "input"
                and r.dtype in _INTS
                and r.loc
            ):
                by_token.setdefault(r.key.token, []).append(r)
        for token, cands in by_token.items():
            first = min(cands, key=lambda r: (r.order, r.key.stem))
            try:
                update.token_ids[token] = tuple(int(i) for i in load_array(first.loc).reshape(-1))  # type: ignore[arg-type]
            except LayerwatchError:
                continue
            state.ids_found.add(token)

    # --- topology -------------------------------------------------------------------------------
    def _read_topology(self, state: _Rank, update: ReaderUpdate) -> None:
        if self._where.dump_dir is None:
            return
        files = sorted(
            Path(e.path)
            for e in scandir(self._where.dump_dir / "model" / state.pid)
            if e.name.endswith(".json")
        )
        try:
            sig = tuple((f.name, f.stat().st_mtime_ns, f.stat().st_size) for f in files)
        except OSError:
            return
        if not files or sig == state.topo_sig:
            return
        models = []
        for f in files:
            try:
                obj = json.loads(f.read_bytes(), parse_constant=lambda _c: None)
            except (OSError, ValueError):
                return  # being written: next poll
            nodes = obj.get("nodes") or []
            start = 0
            if nodes:
                tail = str(nodes[0].get("opName", "0")).rsplit("_", 1)[-1]
                start = int(tail) if tail.isdigit() else 0
            models.append((start, obj))
        state.topo_sig = sig
        topo = Topology(root="root")
        topo.add("root", models[0][1].get("modelName", "") if models else "")

        def walk(item: dict, index: int, parent: str) -> None:
            name = f"{parent}.{index}_{item.get('opType', '')}"
            node = topo.add(
                name, str(item.get("opType", "")), parent, structural_order(name.split(".")[1:])
            )
            node.cls = str(item.get("opType", ""))
            if isinstance(item.get("param"), dict):
                node.attrs = dict(item["param"])  # the op's parameters (precheck reads them)
            state.op_names[name] = str(item.get("opName", ""))
            for i, child in enumerate(item.get("nodes") or ()):
                walk(child, i, name)

        for start, obj in sorted(models, key=lambda m: m[0]):
            for i, item in enumerate(obj.get("nodes") or ()):
                walk(item, start + i, "root")
        self._topology = update.topology = topo


def _counterpart(path: str) -> str:
    """``…/after/intensor0.bin`` ↔ ``…/before/intensor0.bin``."""
    head, side, name = path.rsplit(os.sep, 2)
    return os.sep.join((head, "before" if side == "after" else "after", name))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _shape(text: str) -> tuple[int, ...]:
    return tuple(int(d) for d in text.replace("[", "").replace("]", "").split(",") if d.strip())
