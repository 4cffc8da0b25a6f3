"""Every custom message of the app, in one place.

Worker threads only ever ``post_message`` one of these (thread-safe); handlers on the UI
thread own every change to widgets. Result batches are *not* messages: they are drained
from the source's queue by one timer (per-cell messages froze the UI for 1.5 s).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from layerwatch.engine.records import PairResult
from layerwatch.engine.seam import CaseRow, CellUpdate, PairDetail
from textual.message import Message


@dataclass
class CursorMoved(Message):
    """The grid cursor is on a new cell (visible column ``column``, block index ``block``)."""

    token: int
    column: int
    block: int

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, CursorMoved)


@dataclass
class CellChosen(Message):
    """Enter (or a double click) on a cell: open its block view."""

    token: int
    block: int


@dataclass
class FollowChanged(Message):
    """Follow mode switched (the user moved, or pressed space)."""

    following: bool


@dataclass
class CellPairsLoaded(Message):
    """A worker fetched a cell's pairs (``ResultsView.pairs_in_block``)."""

    token: int
    block: int
    pairs: list[PairResult]
    inputs: dict[int, list[PairResult]] = field(default_factory=dict)
    """Input pairs per index into ``pairs`` (only filled for the block view)."""
    error: str = ""


@dataclass
class DetailLoaded(Message):
    """A worker built the operator view's :class:`PairDetail` (``ResultsView.explain``)."""

    detail: PairDetail | None
    error: str = ""


@dataclass
class ExportFinished(Message):
    """``source.export`` returned (in a worker): the path written, or why not."""

    path: str
    error: str = ""


@dataclass
class CasesLoaded(Message):
    """Every case of a per-case dump pair was compared (or could not be: ``error``)."""

    rows: list[CaseRow]
    error: str = ""


@dataclass
class RankCellsLoaded(Message):
    """A worker fetched the grid as one rank colours it (``ResultsView.rank_cells``)."""

    rank: int | None
    """``None``: the worst over all ranks."""
    ranks: tuple[int, ...]
    cells: list[CellUpdate]
    stepped: bool = False
    """The user asked for the next rank (``r``), not a refresh of the current one."""
    error: str = ""
