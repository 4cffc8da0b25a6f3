"""Reader for msit's manual dump (``msit_llm.dump.manual_dump.dump_data``): one file pairs both runs.

msit writes the golden (torch) tensor to
``msit_dump_{TS}/{pid}_{device}/golden_tensor/{token_id}/{data_id}_tensor.pth`` and records
``{data_id: {token_id: [golden_path, my_path]}}`` in ``golden_tensor/metadata.json``, where
``my_path`` is the target's tensor file (an ATB ``.bin``, or a ``.pth``/``.npy``). Nothing in
msit reads it back; here it is a dump whose golden side is the ``golden_path`` files and whose
target side is the ``my_path`` files, so ``layerwatch compare DIR DIR`` compares them (the same
directory on both sides). A point is node ``root.{data_id}``, stem ``output``, at its token;
order = the data id's place in the file (the order msit recorded them).

msit writes a repeated ``data_id`` twice into the object (once as ``"7"``, once as ``7`` after a
reload): duplicate keys are merged, later entries winning. Relative paths are taken from the
metadata file's directory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.readers import json_stream
from layerwatch.engine.readers.base import DirectoryReader, ReaderUpdate, cut_short_note
from layerwatch.engine.readers.locate import locate_manual as locate
from layerwatch.engine.records import Locator, TensorKey, TensorRecord

NODE_TYPE = "dump_data"


def _merge_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for key, value in pairs:
        key = str(key)
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value  # the later entry wins; the id keeps its first place
    return merged


def parse_metadata(text: str, where: str) -> dict[str, dict[int, tuple[str, str]]]:
    """``{data_id: {token: (golden_path, my_path)}}``; malformed input is one line."""
    try:
        raw = json.loads(text, object_pairs_hook=_merge_pairs)
    except ValueError as exc:
        raise LayerwatchError(f"{where}: not msit manual-dump metadata ({exc})") from None
    return _points(raw, where)


def read_cut(path: Path) -> tuple[dict[str, dict[int, tuple[str, str]]], int] | None:
    """A metadata file ``json.loads`` refused, read as far as it is whole: (its complete data
    ids, where it ends) when it is cut short (msit killed while it rewrote it) and nothing else
    is wrong; None when it is corrupt."""
    cut = json_stream.read_cut(path)
    if cut is None:
        return None
    entries, at = cut
    return _points(_merge_pairs([(key, value) for _, key, value in entries]), str(path)), at


def _points(raw: Any, where: str) -> dict[str, dict[int, tuple[str, str]]]:
    if not isinstance(raw, dict):
        raise LayerwatchError(f"{where}: not msit manual-dump metadata (expected an object)")
    out: dict[str, dict[int, tuple[str, str]]] = {}
    for data_id, tokens in raw.items():
        if not isinstance(tokens, dict):
            raise LayerwatchError(f"{where}: data id {data_id}: expected {{token: [golden, mine]}}")
        for token, paths in tokens.items():
            if (
                not str(token).lstrip("-").isdigit()
                or not isinstance(paths, list)
                or len(paths) != 2
                or not all(isinstance(p, str) for p in paths)
            ):
                raise LayerwatchError(
                    f"{where}: data id {data_id} token {token}: expected [golden_path, my_path]"
                )
            out.setdefault(data_id, {})[int(token)] = (paths[0], paths[1])
    return out


def file_locator(path: str) -> Locator:
    """Where a tensor file's payload is: ``.pth``/``.pt`` (restricted unpickler), ``.npy``,
    or an ATB ``.bin`` (ND layout)."""
    from layerwatch.engine.readers.atb_bin import read_header
    from layerwatch.engine.readers.msit import npy_locator
    from layerwatch.engine.readers.pth import pth_locator

    suffix = Path(path).suffix.lower()
    if suffix in (".pth", ".pt"):
        return pth_locator(path)
    if suffix == ".npy":
        return npy_locator(path)
    if suffix == ".bin":
        header = read_header(path)
        if header.dtype is None or header.data is None:
            raise LayerwatchError(f"{path}: an ATB file without readable tensor data")
        offset, length = header.data
        return Locator(path, offset, length, header.dtype, header.dims)
    raise LayerwatchError(f"{path}: unknown tensor file type (expected .pth, .pt, .npy or .bin)")


class MsitManualReader(DirectoryReader):
    """One side of an msit manual dump; ``side`` (set by ``open_dump``) picks the column."""

    fmt = "msit-manual"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.side = "golden"
        self._seen: set[tuple[str, int]] = set()
        self._noted: set[str] = set()

    def poll(self, changed: Sequence[Path] | None = None, *, final: bool = False) -> ReaderUpdate:
        update = ReaderUpdate()
        if self._gone(update):
            return update
        meta = locate(self.root)
        if meta is None:
            return update
        try:
            text = meta.read_text(encoding="utf-8")
        except OSError as exc:
            update.notes.append(f"{meta}: cannot read: {exc.strerror or exc}")
            return update
        try:
            entries = parse_metadata(text, str(meta))
        except LayerwatchError:
            if not final:
                return update  # being rewritten: the next poll reads it whole
            # msit rewrites the whole file at each point: one it left cut short still pairs
            # the points written before the cut; a corrupt one pairs nothing.
            cut = read_cut(meta)
            if cut is None:
                raise
            entries, at = cut
            note = cut_short_note(meta, at, f"{len(entries)} complete data ids", "the dump")
            if note not in self._noted:
                self._noted.add(note)
                update.notes.append(note)
        column = 0 if self.side == "golden" else 1
        for order, (data_id, tokens) in enumerate(entries.items()):
            for token, paths in sorted(tokens.items()):
                if (data_id, token) in self._seen:
                    continue
                path = paths[column]
                path = path if os.path.isabs(path) else str(meta.parent / path)
                try:
                    loc = file_locator(path)
                except LayerwatchError as exc:
                    if final:
                        self._seen.add((data_id, token))
                        update.notes.append(str(exc))
                    continue
                self._seen.add((data_id, token))
                key = TensorKey(token, f"root.{data_id}", "output")
                update.tensors.append(
                    TensorRecord(key, loc.dtype, loc.shape, loc, None, order, NODE_TYPE, path)
                )
        update.complete = final
        return update
