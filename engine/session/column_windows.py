"""Windows of whole tokens cut from two dumps opened as columns (``readers/index_columns.py``).

The byte-chunk windows of ``windowed.py`` build a record for every index line as it is read;
here both indexes are first opened as columns (token, node, stem, line offset: seconds for
millions of tensors), the windows are cut from the golden side's tensors a token, and a
window's records are built only when it is compared — so opening costs no records, ``--nodes``
builds only the matching ones, and an index out of token order needs no "late" tensors. While
the windows run, an index in token order is kept as each token's byte range (``compact``), not
as a row a tensor.
Every window gets what the whole-run session would know up front: the topology, the weights
and every token's input ids (a divergence is known from the first window on).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import numpy as np
from layerwatch.engine.readers.base import ReaderUpdate

SIDES = ("golden", "target")


class ColumnTable(Protocol):
    head: ReaderUpdate

    def compact(self) -> ColumnTable: ...

    def token_counts(self) -> tuple[np.ndarray, np.ndarray]: ...

    def records(self, low: int, high: int) -> tuple[list[Any], list[str]]: ...


def open_tables(readers: Mapping[str, Any]) -> dict[str, ColumnTable] | None:
    """Both sides as column tables, or None when a reader cannot open one (another format)."""
    tables = {}
    for side in SIDES:
        opener = getattr(readers[side], "open_columns", None)
        table = opener() if opener is not None else None
        if table is None:
            return None
        tables[side] = table
    return tables


def token_windows(
    golden: tuple[np.ndarray, np.ndarray], target: np.ndarray, window: int
) -> list[tuple[int, int]]:
    """(first, last) token of each window from the golden side's (tokens, tensors of each):
    whole tokens, at least ``window`` golden tensors each (the last window takes what is
    left); ``target``'s tokens that the golden lacks are included."""
    have, count = golden
    # np.union1d's values; asking for the counts keeps numpy 2.4 from importing numpy.ma (~8 ms
    # of a compare's start-up) for its masked-array check
    tokens = np.unique(np.concatenate((have, target), axis=None), return_counts=True)[0]
    if not len(tokens):
        return []
    per = np.zeros(len(tokens), np.int64)
    per[np.searchsorted(tokens, have)] = count
    total = np.cumsum(per)
    out: list[tuple[int, int]] = []
    start, base = 0, 0
    while start < len(tokens):
        end = int(np.searchsorted(total, base + window, "left"))
        end = min(max(end, start), len(tokens) - 1)
        out.append((int(tokens[start]), int(tokens[end])))
        base = int(total[end])
        start = end + 1
    return out


def column_windows(
    tables: Mapping[str, ColumnTable], window: int
) -> Iterator[dict[str, ReaderUpdate]]:
    """Per window and side, one ReaderUpdate with that window's records; the first also
    carries the opening's notes."""
    for table in tables.values():
        table.compact()  # whole tokens are read: their byte ranges are all that is kept
    spans = token_windows(
        tables["golden"].token_counts(), tables["target"].token_counts()[0], window
    )
    notes = {side: list(tables[side].head.notes) for side in SIDES}
    for low, high in spans:
        out = {}
        for side in SIDES:
            head = tables[side].head
            tensors, more = tables[side].records(low, high)
            out[side] = ReaderUpdate(
                tensors=tensors,
                topology=head.topology,
                token_ids=dict(head.token_ids),
                notes=notes[side] + more,
                weights=dict(head.weights),
            )
            notes[side] = []
        yield out
    if any(notes.values()):  # nothing to compare: the notes still reach the run
        yield {
            side: ReaderUpdate(
                topology=tables[side].head.topology,
                token_ids=dict(tables[side].head.token_ids),
                notes=notes[side],
            )
            for side in SIDES
        }
