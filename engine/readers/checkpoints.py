"""Weights on one side of ``layerwatch weights``: a checkpoint folder, a state-dict file, a dump.

Nothing is loaded up front: each :class:`WeightEntry` knows its name, dtype and shape and loads
its tensor on demand (safetensors headers give each tensor's byte range, read on demand;
``torch.load(mmap=True)`` maps a zip ``.bin``), so a comparison holds one tensor pair at a time. Pickles are opened only with
``weights_only=True``: a file that would run code is refused with a note, never executed.

A problem with one file (a missing shard, a truncated file, a refused pickle) becomes a note in
:attr:`WeightSet.notes` and that file's tensors are absent; only a side with nothing readable
at all raises :class:`LayerwatchError`.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from layerwatch.capture.errors import LayerwatchError

STATE_DICT_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt")


def _held(value: Any) -> Any:
    """A tensor already in memory (a mapped pickle's): loading it is returning it."""
    return value


@dataclass(frozen=True, slots=True)
class WeightEntry:
    """One named tensor of a side; ``load()`` returns it (a torch tensor or a numpy array)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    source: str
    load: Callable[[], Any]


@dataclass(slots=True)
class WeightSet:
    """A side's tensors in file order, plus one note per file that could not be read."""

    path: str
    entries: dict[str, WeightEntry] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def natural_key(name: str) -> list[Any]:
    """``layers.2`` before ``layers.10``: the closest to model order a safetensors file keeps."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _torch_dtype(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _add_safetensors(ws: WeightSet, path: Path) -> None:
    """Parse the JSON header; each tensor becomes a :class:`Locator` read by engine/readers/load.py.

    Plain reads, not a memory map: the pages of a mapped multi-GB shard would stay in the
    process's resident set until the map closes, and RSS must stay near one tensor pair.
    """
    import struct

    from layerwatch.engine.readers.load import canonical_dtype, load_array
    from layerwatch.engine.records import Locator

    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > min(size - 8, 100 << 20):
                raise ValueError("header length past the end of the file")
            header = json.loads(fh.read(n))
        base = 8 + n
        items = [(k, v) for k, v in header.items() if k != "__metadata__"]
        for name, info in sorted(
            items, key=lambda kv: natural_key(kv[0])
        ):  # header is sorted as text
            begin, end = (int(x) for x in info["data_offsets"])
            if base + end > size:
                ws.notes.append(f"{path}: truncated ({size} bytes, {name} needs {base + end})")
                continue
            dtype = _SAFETENSORS_DTYPES.get(str(info["dtype"]), str(info["dtype"]).lower())
            loc = Locator(
                str(path), base + begin, end - begin, canonical_dtype(dtype), tuple(info["shape"])
            )
            ws.entries[name] = WeightEntry(
                name, dtype, loc.shape, str(path), functools.partial(load_array, loc)
            )
    except (OSError, ValueError, KeyError, TypeError, struct.error, LayerwatchError) as exc:
        ws.notes.append(f"{path}: unreadable safetensors file ({_reason(exc)})")


_SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def _add_pickle(ws: WeightSet, path: Path, prefix: str = "") -> None:
    """A torch state dict (or one tensor, msit's ``weights/NAME.pth``) loaded weights-only."""
    import pickle

    import torch

    try:
        try:
            obj = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:  # a legacy (non-zip) file cannot be memory-mapped
            if "mmap" not in str(exc).lower() and "zip" not in str(exc).lower():
                raise
            obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = _reason(exc)
        ws.notes.append(
            f"{path}: refused: loading it would run code or import objects other than tensors"
            f" ({first})"
        )
        return
    except Exception as exc:  # truncated zip, not a torch file...
        ws.notes.append(f"{path}: unreadable torch file ({_reason(exc)})")
        return
    if isinstance(obj, torch.Tensor):
        items = [(prefix or path.stem, obj)]
    elif isinstance(obj, dict):
        if "state_dict" in obj and isinstance(obj["state_dict"], dict):
            obj = obj["state_dict"]
        items = [(str(k), v) for k, v in obj.items() if isinstance(v, torch.Tensor)]
    else:
        ws.notes.append(f"{path}: holds a {type(obj).__name__}, not a state dict or a tensor")
        return
    for name, tensor in items:
        ws.entries[name] = WeightEntry(
            name,
            _torch_dtype(tensor.dtype),
            tuple(tensor.shape),
            str(path),
            functools.partial(_held, tensor),
        )


def _add_file(ws: WeightSet, path: Path, prefix: str = "") -> None:
    if not path.is_file():
        ws.notes.append(f"{path}: missing")
    elif path.suffix == ".safetensors":
        _add_safetensors(ws, path)
    else:
        _add_pickle(ws, path, prefix)


def _indexed(ws: WeightSet, index: Path) -> None:
    """A sharded checkpoint: the shards its ``weight_map`` names, in first-mention order."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        shards = list(dict.fromkeys(str(v) for v in weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        ws.notes.append(f"{index}: unreadable index ({_reason(exc)})")
        return
    for shard in shards:
        path = index.parent / shard
        if not path.is_file():
            ws.notes.append(f"{path}: missing (named by {index.name})")
            continue
        _add_file(ws, path)


def _dump_weights(ws: WeightSet, root: Path) -> bool:
    """layerwatch dumps: ``{"k": "weight"}`` lines of every ``index.jsonl`` under ``root``."""
    from layerwatch.capture import format as lwf
    from layerwatch.engine.readers.load import canonical_dtype, load_array
    from layerwatch.engine.records import Locator

    indexes = sorted(root.rglob(lwf.INDEX))
    found = False
    for index in indexes:
        try:
            lines = index.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            ws.notes.append(f"{index}: unreadable ({exc.strerror})")
            continue
        for line in lines:
            if '"weight"' not in line:
                continue
            try:
                obj = json.loads(line)
                if obj.get("k") != lwf.K_WEIGHT:
                    continue
                begin, end = int(obj["begin"]), int(obj["end"])
                loc = Locator(
                    str(index.parent / obj["file"]),
                    begin,
                    end - begin,
                    canonical_dtype(str(obj["dtype"])),
                    tuple(int(d) for d in obj["shape"]),
                )
                name = str(obj["name"])
            except (ValueError, KeyError, TypeError, LayerwatchError) as exc:
                ws.notes.append(f"{index}: skipped a bad weight line ({_reason(exc)})")
                continue
            found = True
            ws.entries.setdefault(
                name,
                WeightEntry(
                    name,
                    loc.dtype,
                    loc.shape,
                    loc.path,
                    functools.partial(load_array, loc),
                ),
            )
    return found


def _msit_weights(root: Path) -> list[Path]:
    """msit's ``weights/*.pth`` of the first rank directory that has them (ranks share weights)."""
    for folder in sorted(root.rglob("weights")):
        if folder.is_dir() and (files := sorted(folder.glob("*.pth"))):
            return files
    return []


def open_weights(path: str | os.PathLike[str]) -> WeightSet:
    """Every tensor ``path`` holds (see the module docstring for the accepted layouts)."""
    p = Path(path)
    ws = WeightSet(str(p))
    if not p.exists():
        raise LayerwatchError(f"{p}: no such file or directory")
    if p.is_file():
        if p.suffix not in STATE_DICT_SUFFIXES:
            raise LayerwatchError(f"{p}: not a weights file ({', '.join(STATE_DICT_SUFFIXES)})")
        _add_file(ws, p)
    elif (p / "model.safetensors.index.json").is_file():
        _indexed(ws, p / "model.safetensors.index.json")
    elif files := sorted(p.glob("*.safetensors")):
        for f in files:
            _add_file(ws, f)
    elif (p / "pytorch_model.bin.index.json").is_file():
        _indexed(ws, p / "pytorch_model.bin.index.json")
    elif files := sorted(p.glob("pytorch_model*.bin")):
        for f in files:
            _add_file(ws, f)
    elif files := _msit_weights(p):
        for f in files:  # msit: one tensor per file, named by the file (root.<module>.<param>)
            _add_file(ws, f, prefix=f.stem)
    elif not _dump_weights(ws, p):
        files = sorted(f for f in p.iterdir() if f.suffix in STATE_DICT_SUFFIXES)
        for f in files:
            _add_file(ws, f)
        if not files and not ws.notes:
            raise LayerwatchError(
                f"{p}: no weights found (no *.safetensors, pytorch_model*.bin, weights/*.pth,"
                " or dumped weights)"
            )
    if not ws.entries:
        detail = "; ".join(ws.notes) if ws.notes else "no tensors"
        raise LayerwatchError(f"{p}: nothing readable: {detail}")
    return ws
