"""The golden run's input ids per token, read from its layerwatch dump (for ``follow``).

Plain Python (no torch, no numpy) so that ``layerwatch dump --follow`` can check the golden
dump in the launcher, before the child starts, and say what is wrong in one line.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from . import format as fmt
from .errors import LayerwatchError


@dataclass(frozen=True)
class GoldenTokens:
    """Token ``k`` → the input ids the golden root received at its ``k``-th forward call."""

    rank_dir: Path
    ids: tuple[tuple[int, ...], ...]
    case_starts: frozenset[int] = frozenset()
    """Tokens where a case (a new prompt) begins: the step before one is not forced."""

    def __len__(self) -> int:
        return len(self.ids)


def golden_rank_dir(path: str | os.PathLike[str]) -> Path:
    """The one ``{device}_{pid}`` directory of a layerwatch dump (or ``path`` itself)."""
    root = Path(os.fsdecode(path)).expanduser()
    if not root.exists():
        raise LayerwatchError(f"follow: golden dump {root} does not exist")
    if (root / fmt.INDEX).is_file():
        return root
    try:
        ranks = sorted(d for d in root.iterdir() if (d / fmt.INDEX).is_file())
    except OSError as exc:
        raise LayerwatchError(f"follow: cannot read golden dump {root}: {exc.strerror}") from None
    if not ranks:
        raise LayerwatchError(
            f"follow: {root} is not a layerwatch dump (no {fmt.INDEX}); --follow needs the "
            "golden run captured by layerwatch (its token ids)"
        )
    if len(ranks) > 1:
        names = ", ".join(d.name for d in ranks[:4])
        raise LayerwatchError(
            f"follow: {root} holds {len(ranks)} processes' dumps ({names}); pass one of them"
        )
    return ranks[0]


def read_golden(path: str | os.PathLike[str]) -> GoldenTokens:
    """Every token's input ids from the golden dump's index; a one-line error if unusable."""
    rank = golden_rank_dir(path)
    try:
        text = (rank / fmt.INDEX).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise LayerwatchError(f"follow: cannot read {rank / fmt.INDEX}: {exc.strerror}") from None
    tokens: dict[int, tuple[int, ...]] = {}
    starts: set[int] = set()
    for line in text.splitlines():
        if '"token"' not in line:
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue  # a torn last line: the reader skips it too
        if isinstance(obj, dict) and obj.get("k") == fmt.K_CASE:
            if isinstance(obj.get("token"), int):
                starts.add(obj["token"])
            continue
        if not isinstance(obj, dict) or obj.get("k") != fmt.K_TOKEN:
            continue
        ids = obj.get("input_ids")
        try:
            token = int(obj["token"])
            if ids is None:
                raise ValueError
            tokens[token] = tuple(int(i) for i in ids)
        except (KeyError, TypeError, ValueError):
            raise LayerwatchError(
                f"follow: {rank / fmt.INDEX}: token line without input ids: {line[:80]}"
            ) from None
    if not tokens:
        raise LayerwatchError(f"follow: golden dump {rank} has no token lines (did it run?)")
    missing = [k for k in range(max(tokens) + 1) if k not in tokens]
    if missing:
        raise LayerwatchError(
            f"follow: golden dump {rank} has no token line for token {missing[0]}"
        )
    return GoldenTokens(rank, tuple(tokens[k] for k in range(len(tokens))), frozenset(starts))
