"""A report's float text in bulk: the bytes Python's ``repr`` (CSV) and ``json`` (JSON rows) write.

A compare of many small pairs spent ~2/3 of a CSV line's cost in ``float.__repr__`` (Python's
dtoa, 0.6–1.6 µs a 17-digit value on this box; ARCHITECTURE.md "Many small pairs"), and the
``--json``/JSON/JSONL rows pay the same through ``json``'s C encoder. orjson formats a whole
list of floats in one call with a shortest round-trip algorithm; its text differs from
``repr`` in two ways only, fixed up here where they can occur (``tests/engine/test_floattext.py``
holds the equality over edge cases and millions of random bit patterns):

- values in [1e-5, 1e-4) are positional (``0.00001234``; ``repr``: ``1.234e-05``) — the same
  digits rewritten;
- a one-digit negative exponent is not padded (``1e-7``; ``repr``: ``1e-07``) — a ``0`` put in.

NaN and ±Inf come out as ``null``, as do None; CSV cells take those from the values. orjson is
a dependency (pyproject.toml); where it cannot be imported every function here falls back to
the standard library's text, value by value, to the same bytes.
"""

from __future__ import annotations

import json
import math
import re
from itertools import chain
from typing import Any

from layerwatch.engine import orjson_lazy

_BULK = 2048
"""Numbers in a block below which they are written value by value: orjson's import
(``engine/orjson_lazy.py``) costs what ~6 000 ``repr`` calls cost, and a compare that writes no
report does not import it."""


def _bulk(numbers: int) -> Any:
    """orjson for a block of ``numbers`` values (imported on the first such block), or None:
    a small block, or no orjson."""
    if numbers < _BULK:
        return None
    return orjson_lazy.module(True)


ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))
"""One encoder for every row: ``json.dumps`` with options builds a new one per call, which cost
~9 µs a row (a tenth of a small-tensor compare's own time)."""

_PAD = re.compile(rb"e-(?=\d[,\]}])")
"""orjson's one-digit negative exponent (``1e-7``) where a number ends: ``repr`` writes ``e-07``."""
_POSITIONAL = re.compile(rb"0\.0000\d+")
"""orjson's positional text of a value in [1e-5, 1e-4) (``repr`` is scientific there): only
such a value starts ``0.0000`` right after a separator or its sign (:func:`_sci`;
``100.00001`` does not). No optional sign in the pattern: a literal start is searched fast."""
_BEFORE = frozenset(b",:[")
_MINUS = ord("-")
_NONE = type(None)
_PER_ROW = 16
"""About the numbers of a JSON row (its metrics), for :data:`_BULK`."""
_FLOAT_OR_NONE = frozenset((float, _NONE))
_RUN = 5
"""About the numbers of a CSV line's run, for :data:`_BULK` (:func:`cell_runs`: 15 in three)."""


def _sci(match: re.Match[bytes]) -> bytes:
    """A match of :data:`_POSITIONAL` as ``repr`` writes it, if it is a whole number: the same
    shortest digits, ``d.ddde-05`` (a sign before it stays)."""
    text, at = match.string, match.start()
    before = text[at - 1]
    if before == _MINUS:
        before = text[at - 2]
    if before not in _BEFORE:
        return match.group()
    digits = match.group()[6:]
    if len(digits) == 1:
        return digits + b"e-05"
    return digits[:1] + b"." + digits[1:] + b"e-05"


def _fixed(text: bytes) -> bytes:
    """orjson's number text as ``repr`` writes it (module docstring); ``text`` holds numbers
    only between separators (a list), or a flat dict's values whose keys hold no ``,``, ``}``
    or ``:``."""
    if b"e-" in text:
        text = _PAD.sub(b"e-0", text)
    if b"0.0000" in text:
        text = _POSITIONAL.sub(_sci, text)
    return text


def cell(value: Any) -> str:
    """One number cell as the CSV writes it: empty for None, else ``repr`` of the float (an
    int or a numpy scalar as float)."""
    if value is None:
        return ""
    return repr(value) if value.__class__ is float else repr(float(value))


def cells(values: list[Any]) -> list[str]:
    """:func:`cell` of each value, from one orjson call (:func:`cell_runs` of one-value runs)."""
    return cell_runs([(value,) for value in values], 1)


def cell_runs(runs: list[Any], per_run: int = _RUN) -> list[str]:
    """Each run of numbers (a non-empty tuple or list) as its :func:`cell` texts joined by
    ``,``, from one orjson call over the whole block and its text split a run rather than a value
    (a CSV line's 15 numbers are three runs, ``report.field_lines``: 0.6 µs a line less than a
    split into cells). ``per_run``: about the numbers a run, for :data:`_BULK`. NaN/Inf (orjson's
    ``null`` where the values hold no None) take :func:`cell`; so does a block holding anything
    but floats and None (an int, a numpy scalar: written as ``float``)."""
    lib = _bulk(per_run * len(runs))
    if lib is not None and runs:
        types = set(map(type, chain.from_iterable(runs)))
        if types <= _FLOAT_OR_NONE:
            text = _fixed(lib.dumps(runs))[2:-2].decode("ascii")
            if "null" not in text:
                return text.split("],[")
            if text.count("null") == sum(run.count(None) for run in runs):
                return text.replace("null", "").split("],[")  # no NaN or Inf: nulls are Nones
            return [
                ",".join(map(cell, run)) if "null" in part else part
                for part, run in zip(text.split("],["), runs, strict=True)
            ]
    return [",".join(map(cell, run)) for run in runs]


def json_rows(rows: list[dict[str, Any]], sep: bytes) -> bytes:
    """``rows`` (fresh dicts: their ``metrics`` are swapped for a moment) as ``ENCODER``
    writes each, a ``metrics`` dict's non-finite values as null, joined by ``sep``. Each row's
    ``metrics`` (a flat dict of numbers) is formatted apart and fixed up; the row around it goes
    through orjson as it is, unless its text holds an escape, a non-ASCII character or DEL
    (``json`` escapes those otherwise; a row's other values are no floats): that row, as before,
    the standard library's encoder writes."""
    lib = _bulk(_PER_ROW * len(rows))
    if lib is not None and rows:
        metrics = [row["metrics"] for row in rows]
        try:
            parts = _orjson_rows(lib, rows, metrics)
        except TypeError:  # a numpy scalar, an int beyond 64 bits: json's own rules
            parts = None
        finally:
            for row, values in zip(rows, metrics, strict=True):
                row["metrics"] = values
        if parts is not None:
            text = sep.join(parts)
            if _plain(text):
                return text
            return sep.join(
                part if _plain(part) else _encoded(row)
                for part, row in zip(parts, rows, strict=True)
            )
    return sep.join(map(_encoded, rows))


def _plain(text: bytes) -> bool:
    """Whether orjson's ``text`` is ``json``'s too: no escape, nothing beyond ASCII, no DEL."""
    return text.isascii() and b"\\" not in text and b"\x7f" not in text


def _encoded(row: dict[str, Any]) -> bytes:
    return ENCODER.encode(_finite(row)).encode()


def _orjson_rows(
    lib: Any, rows: list[dict[str, Any]], metrics: list[dict[str, Any]]
) -> list[bytes] | None:
    """Each row's orjson text, its ``metrics`` fixed up (:func:`_fixed`); None where a key of
    ``metrics`` holds ``:``, ``,`` or ``}`` (the fix-ups would not know a key from a value)."""
    dumps, fragment = lib.dumps, lib.Fragment
    blob = b"\n".join(map(dumps, metrics))
    keys = sum(map(len, metrics))
    if (
        blob.count(b":") != keys
        or blob.count(b",") != keys - len(metrics) + metrics.count({})
        or blob.count(b"}") != len(metrics)
    ):
        return None
    for row, values in zip(rows, _fixed(blob).split(b"\n"), strict=True):
        row["metrics"] = fragment(values)
    return list(map(dumps, rows))


def _finite(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with its ``metrics``' non-finite values as None (strict JSON)."""
    metrics = row.get("metrics")
    if metrics is None:
        return row
    return {**row, "metrics": finite(metrics)}


def finite(metrics: dict[str, Any]) -> dict[str, Any]:
    """A copy with non-finite values as ``None`` (strict JSON); the common all-finite case is one pass."""
    if math.isfinite(sum(metrics.values())):  # a NaN or Inf makes the sum non-finite (an
        # overflowing sum of finite values takes the exact pass below, to the same result)
        return dict(metrics)
    return {k: (v if math.isfinite(v) else None) for k, v in metrics.items()}
