"""Where each format's dump is: every format's path test, in one module that imports no reader.

``open_dump`` tries the formats in turn on every path it is given (and on each ``msit_dump_*``
run inside msit's output folder), so these tests run for every compare. Kept here, apart from
the readers, so a compare imports only the reader of the format it found: importing the five
readers to ask each "is this yours?" cost ~20 ms of a ~0.3 s compare of small msit dumps
(``python -X importtime``; most of it their dataclasses being built). Each reader imports its
own test and names from here.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from layerwatch.capture import format as lwf
from layerwatch.engine.readers.base import is_rank_dir_name, scandir

# --- layerwatch ---------------------------------------------------------------------------


def is_rank_dir(path: Path) -> bool:
    return (path / lwf.INDEX).is_file() or (path / lwf.MANIFEST).is_file()


def detect(path: Path) -> bool:
    """A rank directory, or a run directory holding at least one."""
    if is_rank_dir(path):
        return True
    return any(e.is_dir() and is_rank_dir(Path(e.path)) for e in scandir(path))


# --- msprobe ------------------------------------------------------------------------------

DUMP = "dump.json"
_STEP = re.compile(r"^step(\d+)$")
_RANK = re.compile(r"^(rank|proc)(\d+)$")


@dataclass(frozen=True, slots=True)
class MsprobeWhere:
    steps: tuple[Path, ...] | None
    """Step directories, or ``None``: discover ``step*`` under ``base``."""
    base: Path
    rank_dirs: tuple[Path, ...] | None = None
    """Only these rank directories (the user pointed at one)."""


def locate_msprobe(path: Path) -> MsprobeWhere | None:
    if path.is_file() and path.name == DUMP:
        return MsprobeWhere((path.parent.parent,), path.parent.parent, (path.parent,))
    if (path / DUMP).is_file():
        return MsprobeWhere((path.parent,), path.parent, (path,))
    entries = scandir(path)
    if any(
        e.is_dir() and _RANK.match(e.name) and os.path.isfile(os.path.join(e.path, DUMP))
        for e in entries
    ):
        return MsprobeWhere((path,), path)
    steps = [e for e in entries if e.is_dir() and _STEP.match(e.name)]
    if any(_RANK.match(r.name) for s in steps for r in scandir(s.path)):
        return MsprobeWhere(None, path)
    return None


# --- msit torch dumps ---------------------------------------------------------------------

TREE = "model_tree.json"


def _is_token(name: str) -> bool:
    return name.isdigit()


@dataclass(frozen=True, slots=True)
class MsitWhere:
    """What an msit path points at."""

    tensors_dir: Path
    """The ``torch_tensors`` directory (parent of the rank directories)."""
    ranks: tuple[str, ...] | None
    """Only these rank directories (the user pointed at a rank or token dir), or ``None``: all."""
    token: int | None
    """Only this token (the user pointed at a token dir)."""


def _has_node_dirs(token_dir: str) -> bool:
    return any(e.is_dir() and e.name.startswith("root") for e in scandir(token_dir))


def _is_rank(path: Path) -> bool:
    """A ``{device}_{pid}`` directory of an msit torch dump (tree file or ``root*`` node dirs)."""
    if (path / TREE).is_file():
        return True
    return is_rank_dir_name(path.name) and any(
        _is_token(e.name) and e.is_dir() and _has_node_dirs(e.path) for e in scandir(path)
    )


def locate_msit(path: Path) -> MsitWhere | None:
    """Where an msit torch dump is, for any directory msit itself accepts; ``None`` if none."""
    if (path / "torch_tensors").is_dir():
        return MsitWhere(path / "torch_tensors", None, None)
    if _is_token(path.name) and (
        (path.parent / TREE).is_file()
        or (is_rank_dir_name(path.parent.name) and _has_node_dirs(str(path)))
    ):
        return MsitWhere(path.parent.parent, (path.parent.name,), int(path.name))
    if _is_rank(path):
        return MsitWhere(path.parent, (path.name,), None)
    has_ranks = any(
        e.is_dir() and is_rank_dir_name(e.name) and _is_rank(Path(e.path)) for e in scandir(path)
    )
    if has_ranks or path.name == "torch_tensors":
        return MsitWhere(path, None, None)
    return None


# --- ATB ----------------------------------------------------------------------------------

_OP_DIR = re.compile(r"^(\d+)_(.+)$")


@dataclass(frozen=True, slots=True)
class AtbWhere:
    dump_dir: Path | None
    """The ``msit_dump_*`` directory (holds ``model/``), when known."""
    tensors_dir: Path
    ranks: tuple[str, ...] | None
    token: int | None


def _looks_like_rank(path: Path) -> bool:
    for tok in scandir(path):
        if tok.is_dir() and tok.name.isdigit():
            return any(e.is_dir() and _OP_DIR.match(e.name) for e in scandir(tok.path))
    return False


def locate_atb(path: Path) -> AtbWhere | None:
    """Where an ATB dump is, for a dump dir, its ``tensors`` dir, a rank dir or a token dir."""
    if (path / "tensors").is_dir() and not (path / "torch_tensors").is_dir():
        return AtbWhere(path, path / "tensors", None, None)
    if path.name == "tensors" and not (path / "model_tree.json").exists():
        return AtbWhere(path.parent, path, None, None)
    if is_rank_dir_name(path.name) and (path.parent.name == "tensors" or _looks_like_rank(path)):
        dump = path.parent.parent if path.parent.name == "tensors" else None
        return AtbWhere(dump, path.parent, (path.name,), None)
    rank = path.parent
    if (
        path.name.isdigit()
        and is_rank_dir_name(rank.name)
        and (rank.parent.name == "tensors" or _looks_like_rank(rank))
    ):
        dump = rank.parent.parent if rank.parent.name == "tensors" else None
        return AtbWhere(dump, rank.parent, (rank.name,), int(path.name))
    return None


# --- msit's manual dumps (golden_tensor/metadata.json) ------------------------------------

DIRNAME = "golden_tensor"
METADATA = "metadata.json"


def locate_manual(path: Path) -> Path | None:
    """The ``metadata.json`` of the manual dump at ``path`` (the ``golden_tensor`` directory, its
    rank directory, or the ``msit_dump_*`` run holding one rank), or ``None``."""
    for candidate in (path / METADATA, path / DIRNAME / METADATA):
        if candidate.is_file() and (candidate.parent.name == DIRNAME):
            return candidate
    found = [
        Path(e.path) / DIRNAME / METADATA
        for e in scandir(path)
        if e.is_dir() and (Path(e.path) / DIRNAME / METADATA).is_file()
    ]
    return found[0] if len(found) == 1 else None
