"""msit's ``logitscmp`` layout: a folder of ``*_{key}_{token}.pth`` files, one logits tensor each.

``msit llm logitsdump`` (MindIE modeltest) writes the final logits of every generated token of
each bad case as its own ``torch.save`` file; ``msit llm logitscmp`` pairs two such folders by
file name. The tensor is 1-D ``[V]`` or ``[1, 1, V]`` / ``[1, V]`` (msit's ``squeeze(0)`` crashes
on the latter; we accept every shape with one non-unit axis). Files are read without torch
(:mod:`.pth`). Keys are msit's: an integer, ``HumanEval/N`` written with its ``/`` replaced, or
any name without ``_``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.readers.base import scandir
from layerwatch.engine.records import Locator

NAME = re.compile(r"^(?P<prefix>.*?)_?(?P<key>[^_]+)_(?P<token>\d+)\.pth$")
"""``logits_{key}_{token}.pth`` (any prefix; msit needs only the ``_{key}_{token}`` tail)."""


@dataclass(frozen=True)
class LogitsFile:
    """One token's logits of one case."""

    key: str
    token: int
    path: Path


def logits_files(path: str | os.PathLike[str]) -> list[LogitsFile]:
    """The ``*_{key}_{token}.pth`` files right inside ``path`` (an empty list if none)."""
    out = []
    for entry in scandir(path):
        m = NAME.match(entry.name)
        if m is not None and entry.is_file():
            out.append(LogitsFile(m["key"], int(m["token"]), Path(entry.path)))
    return sorted(out, key=lambda f: (_case_order(f.key), f.token))


def detect(path: str | os.PathLike[str]) -> bool:
    """A folder of logits files and nothing of a tensor dump (no index, no rank folders)."""
    p = Path(path)
    if not p.is_dir() or (p / "index.jsonl").exists() or (p / "model_tree.json").exists():
        return False
    return bool(logits_files(p))


def locate(file: LogitsFile) -> Locator:
    """The file's tensor as a 1-D ``[V]`` locator; a one-line error for other shapes."""
    from layerwatch.engine.readers.pth import pth_locator  # every compare asks detect() only

    loc = pth_locator(file.path)
    wide = [d for d in loc.shape if d != 1]
    if len(wide) > 1 or not loc.shape:
        raise LayerwatchError(
            f"{file.path}: logits of shape {list(loc.shape)}: expected [V], [1, V] or [1, 1, V]"
        )
    return loc


def _case_order(key: str) -> tuple[int, int | str]:
    return (0, int(key)) if key.isdigit() else (1, key)
