"""What every dump reader gives the engine: the ``DumpReader`` protocol and ``ReaderUpdate``.

A reader is incremental: ``poll()`` returns only what landed since the previous poll, so the
live pipeline can call it per arrival and a finished dump is read with one ``poll(None)``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from layerwatch.engine.records import Locator, Stats, TensorRecord, Topology, plain_stats


@dataclass(slots=True)
class ReaderUpdate:
    """What one ``poll()`` found. Empty lists/dicts mean "nothing new"."""

    tensors: list[TensorRecord] = field(default_factory=list)
    topology: Topology | None = None
    """The module tree when it is new or changed since the last poll, else ``None``."""
    token_ids: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Input ids the root received at token t (only tokens learnt in this poll)."""
    complete: bool = False
    """The writer said it finished (layerwatch ``K_END`` on every rank); sticky once true."""
    notes: list[str] = field(default_factory=list)
    """One-line messages for the user: a writer error, a skipped file, an unsupported dtype."""
    weights: dict[str, Locator] = field(default_factory=dict)
    """Full dumped parameters by dotted name ``root.x.weight``, when the dump has them."""
    case_marks: list[tuple[str, str, int]] = field(default_factory=list)
    """Per-case capture: ``("case" | "case_end", key, token)`` in index order (``engine/cases.py``)."""

    def extend(self, other: ReaderUpdate) -> None:
        """Fold a later update into this one (tensors appended, newer topology wins)."""
        self.tensors.extend(other.tensors)
        self.topology = other.topology or self.topology
        self.token_ids.update(other.token_ids)
        self.complete = self.complete or other.complete
        self.notes.extend(other.notes)
        self.weights.update(other.weights)
        self.case_marks.extend(other.case_marks)

    def only_nodes(self, pattern: str) -> ReaderUpdate:
        """``--nodes GLOB``: keep the tensors of matching nodes (names as each dump has them)."""
        self.tensors = [r for r in self.tensors if fnmatchcase(r.key.node, pattern)]
        return self

    def __bool__(self) -> bool:
        return (
            bool(self.tensors or self.topology or self.token_ids or self.notes or self.weights)
            or bool(self.case_marks)
            or self.complete
        )


@runtime_checkable
class DumpReader(Protocol):
    """Reads one side's dump, incrementally."""

    fmt: str
    """``layerwatch`` / ``msit`` / ``atb`` / ``msprobe``."""
    root: Path
    """The directory (or file) the user pointed at."""

    def poll(self, changed: Sequence[Path] | None = None, *, final: bool = False) -> ReaderUpdate:
        """What landed since the last poll. ``None``: scan everything; else only these paths
        (files or directories) are new — cheap per call, and never returns a tensor twice.
        ``final=True`` (with ``None``): the writer has finished, so a file still incomplete is
        truncated or corrupt — reported once as a note (:func:`skipped_note`), not waited for."""
        ...

    def watch_roots(self) -> list[Path]:
        """Directories a watcher should follow (recursively) for this dump."""
        ...


# --- helpers shared by the readers ------------------------------------------------------------
class DirectoryReader:
    """What the readers of a dump directory share: watching their root, and saying once
    (not at every poll) that the directory disappeared."""

    root: Path
    _gone_noted: bool = False

    def watch_roots(self) -> list[Path]:
        return [self.root]

    def _gone(self, update: ReaderUpdate) -> bool:
        """``True`` when the dump directory is gone (with a note the first time)."""
        if self.root.is_dir():
            return False
        if not self._gone_noted:
            update.notes.append(f"{self.root}: dump directory disappeared")
            self._gone_noted = True
        return True


class TokenDirReader(DirectoryReader):
    """A reader of a dump with a directory per token under each rank (msit, ATB): ``compare``
    reads a long run a token directory at a time (``poll_chunk``, engine/session/windowed.py)."""

    _chunk_tokens: list[int] | None = None
    """Tokens not yet handed out by ``poll_chunk``, last first (None: not listed yet)."""

    def _discover(self) -> list[Any]:
        raise NotImplementedError

    def _token_dirs(self, state: Any) -> list[Path]:
        raise NotImplementedError

    def _tokens(self, state: Any) -> set[int]:
        """The tokens a rank has a directory for."""
        return {int(d.name) for d in self._token_dirs(state) if d.is_dir()}

    def _next_chunk_token(
        self, update: ReaderUpdate, read_rank: Callable[[Any, ReaderUpdate], None]
    ) -> int | None:
        """The next token ``poll_chunk`` reads, or None after the last; the first call lists
        every rank's tokens after ``read_rank`` read what a rank holds once (its topology)."""
        if self._chunk_tokens is None:
            self._chunk_tokens = []
            if not self._gone(update):
                tokens: set[int] = set()
                for state in self._discover():
                    read_rank(state, update)
                    tokens |= self._tokens(state)
                self._chunk_tokens = sorted(tokens, reverse=True)
        return self._chunk_tokens.pop() if self._chunk_tokens else None


_RANK_DIR = re.compile(r"^([A-Za-z]*)(\d*)_(\d+)$")
_TP_RANK_DIR = re.compile(r"^rank(\d+)$")
"""A tensor-parallel process's directory, named by its ``torch.distributed`` rank
(``capture/collectives.py``)."""


def is_rank_dir_name(name: str) -> bool:
    """``cpu_1234``, ``npu3_77``, ``0_1234`` (ATB: ``{device_id}_{pid}``), ``rank3``."""
    return _RANK_DIR.match(name) is not None or _TP_RANK_DIR.match(name) is not None


def tp_rank(name: str) -> int | None:
    """The rank a ``rank{r}`` directory names, else ``None``."""
    match = _TP_RANK_DIR.match(name)
    return int(match.group(1)) if match else None


def rank_sort_key(name: str) -> tuple[int, int, str]:
    """Sort rank directories by rank, else by device number, then pid (``cpu`` counts as 0)."""
    rank = tp_rank(name)
    if rank is not None:
        return (rank, 0, name)
    match = _RANK_DIR.match(name)
    if match is None:
        return (1 << 30, 0, name)
    return (int(match.group(2) or 0), int(match.group(3)), name)


class RankIndex:
    """Stable rank numbers for rank directories: sorted at the first scan, later ones appended.

    Once a directory has a number it keeps it, so records already handed out stay valid when
    another rank directory appears during a live run.
    """

    def __init__(self) -> None:
        self._ranks: dict[str, int] = {}

    def assign(self, names: Sequence[str]) -> None:
        for name in sorted((n for n in names if n not in self._ranks), key=rank_sort_key):
            taken = set(self._ranks.values())
            rank = tp_rank(name)  # ``rank1`` is rank 1 even when rank0 is missing or not given
            if rank is None or rank in taken:
                rank = len(self._ranks)
                while rank in taken:
                    rank += 1
            self._ranks[name] = rank

    def __call__(self, name: str) -> int:
        if name not in self._ranks:
            self.assign([name])
        return self._ranks[name]

    def __contains__(self, name: object) -> bool:
        return name in self._ranks


_EXACT_INT = 1 << 53
"""Counts below this survive the float round trip of the general path unchanged."""


def stats_from(values: Mapping[str, object] | None) -> Stats | None:
    """``Stats`` from a mapping with ``max min mean norm`` (+ ``nan inf``); None when absent."""
    if not values:
        return None
    # the common line (our index's: four floats, two small counts) without the name search
    # below, to the same values: ~4 µs a tensor line otherwise
    get = values.get
    high, low, mean, norm = get("max"), get("min"), get("mean"), get("norm")
    nan, inf = get("nan", 0), get("inf", 0)
    if (
        high.__class__ is float
        and low.__class__ is float
        and mean.__class__ is float
        and norm.__class__ is float
        and nan.__class__ is int
        and inf.__class__ is int
        and 0 <= nan < _EXACT_INT
        and 0 <= inf < _EXACT_INT
    ):
        return plain_stats(high, low, mean, norm, nan, inf)

    def num(key: str, *alts: str) -> float:
        for k in (key, *alts):
            v = values.get(k)
            if v is not None and not isinstance(v, (dict, list)):
                try:
                    return float(v)  # type: ignore[arg-type]
                except (TypeError, ValueError):
                    continue
        return float("nan")

    return Stats(
        max=num("max", "Max"),
        min=num("min", "Min"),
        mean=num("mean", "Mean"),
        norm=num("norm", "Norm", "l2norm", "L2Norm"),
        nan=int(num("nan") if values.get("nan") is not None else 0),
        inf=int(num("inf") if values.get("inf") is not None else 0),
    )


def scandir(path: str | os.PathLike[str]) -> list[os.DirEntry[str]]:
    """``os.scandir`` as a list; a missing or unreadable directory is empty (the caller notes it)."""
    try:
        with os.scandir(path) as it:
            return list(it)
    except OSError:
        return []


def skipped_note(path: str | os.PathLike[str]) -> str:
    """The note for a file that will never be whole (``poll(None, final=True)``)."""
    return f"{path}: truncated or corrupt, skipped"


CUT_SHORT = ": cut short at character "
"""What every cut-short note holds (:func:`cut_short_note`; engine/outcome.py's ``mismatch``
looks for it: the tensors a cut left unpaired are no sign of unrelated dumps)."""


def cut_short_note(path: str | os.PathLike[str], at: int, read: str, rest: str) -> str:
    """The note for a file that ends part-way (a run killed while it wrote it): what was read
    before the cut (``read``, e.g. ``143 complete calls``) is compared, ``rest`` (e.g. ``step0
    rank0``) after it is not."""
    return f"{path}{CUT_SHORT}{at}, after {read}; the rest of {rest} is not compared"


def is_tmp_name(name: str) -> bool:
    """Names writers use for files being written (never read them)."""
    return name.startswith((".tmp-", ".")) or name.endswith((".tmp", ".part", ".swp"))
