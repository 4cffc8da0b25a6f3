"""Metric value → colour bucket: a log scale, so 0.9999 and 0.999 and 0.99 look different.

Cosine similarity sits near 1.0 almost everywhere, so a linear 0..1 scale paints every cell
the same green. Every grid metric is turned into an *error* (``1 - cos`` for cosine, the
value itself for the error metrics) and shown as ``d = -log10(error)``: the number of
matching digits (``d = 4`` ⇔ cos 0.9999). ``d`` is quantised to tenths, and a cell's *code*
(``state * 128 + q``) indexes precomputed texts and styles, so drawing a cell is two list
look-ups and no float formatting.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from layerwatch.engine.records import COSINE, LOCAL
from layerwatch.engine.seam import CellState
from rich.color import Color
from rich.style import Style

CELL_WIDTH = 5
"""Characters of one cell's text; the grid adds a one-character gap after it."""
CODES_PER_STATE = 128
Q_MAX = 99
"""Largest quantised digit count (9.9 digits)."""
Q_EXACT = 100
"""The two sides agree exactly (error 0)."""
Q_UNKNOWN = 101
"""No value for this metric in this cell."""
Q_PARTING = 102
"""Not a cell value: the code of the mark on the step where the generated tokens part."""
Q_VERDICT = 103
"""No metric at all (the scan grid has no golden): the cell shows its verdict as a mark."""
N_CODES = CODES_PER_STATE * (max(CellState) + 1)


def to_error(metric: str, values: np.ndarray) -> np.ndarray:
    """The error form of a metric (smaller is better); cosine keeps its nines as ``1 - cos``;
    ``local_error`` below 0 (less error than the inputs brought in) counts as none."""
    values = np.asarray(values, dtype=np.float64)
    if metric == COSINE:
        return 1.0 - values
    if metric == LOCAL:
        return np.maximum(values, 0.0)
    return np.abs(values)


def quantise(errors: np.ndarray) -> np.ndarray:
    """``round(10 * -log10(error))`` clipped to 0..99, with codes for exact and unknown."""
    errors = np.asarray(errors, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        digits = -np.log10(errors)
    q = np.clip(np.rint(np.nan_to_num(digits, nan=0.0, posinf=Q_MAX, neginf=0.0) * 10), 0, Q_MAX)
    q = q.astype(np.int16)
    q[errors <= 0] = Q_EXACT
    q[np.isnan(errors)] = Q_UNKNOWN
    return q


def band(q: int) -> int:
    """Colour band 0..5 (whole digits, 5 = five or more) or 6 for an exact match."""
    if q == Q_EXACT:
        return 6
    return min(int(q) // 10, 5)


def codes_for(states: np.ndarray, q: np.ndarray) -> np.ndarray:
    return states.astype(np.int16) * CODES_PER_STATE + q


# --- texts ---------------------------------------------------------------------------------
GLYPH_FIRST_BAD = "!"
GLYPH_DIVERGED = "≠"
GLYPH_PARTING = "»"
"""Row mark of the step whose logits chose a different token (engine/seam.py Divergence)."""


def _digits(q: int) -> str:
    if q == Q_EXACT:
        return "  =  "
    if q > Q_MAX:
        return "  ?  "
    return f" {q / 10:3.1f} "


def _text(state: int, q: int) -> str:
    if q == Q_VERDICT and state == CellState.PASS:
        return "  ✓  "
    if q == Q_VERDICT and state == CellState.FAIL:
        return "  ✖  "
    if state == CellState.EMPTY:
        return "  ·  "
    if state == CellState.WAITING:
        return "  …  "
    if state == CellState.NONFINITE:
        return " NaN "
    if state == CellState.ERROR:
        return " ERR "
    if state == CellState.DIVERGED and q == Q_PARTING:
        return f"  {GLYPH_PARTING}  "
    if state == CellState.DIVERGED:
        # Inputs differ from an earlier token on: the metrics compare unrelated tensors.
        return f"  {GLYPH_DIVERGED}  "
    return _digits(q)


PARTING_CODE = CellState.DIVERGED * CODES_PER_STATE + Q_PARTING
"""Text and style of the parting mark (no cell ever gets this code: ``quantise`` stops at
:data:`Q_UNKNOWN`)."""

CELL_TEXTS: list[str] = [
    _text(code // CODES_PER_STATE, code % CODES_PER_STATE) for code in range(N_CODES)
]
"""Cell text by code; the first character is the glyph slot (``!`` marks the first failure)."""


# --- colours -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Scheme:
    """Background (and text) colours of the bands and states for one colour system."""

    passing: tuple[str, ...]
    """Bands 0 (< 1 digit) .. 5 (≥ 5 digits), then exact."""
    fail_bright: str
    fail_dark: str
    diverged: str
    """Grey: those cells were not compared (the target was fed other tokens)."""
    parting: str
    nonfinite: str
    error: str
    muted: str
    dark_text: str = "#101010"
    light_text: str = "#f5f5f5"


RGB = Scheme(
    passing=("#f4511e", "#ffb300", "#c0ca33", "#00897b", "#43a047", "#1b5e20", "#0d3b1e"),
    fail_bright="#ff1744",
    fail_dark="#b71c1c",
    diverged="#3a3a3a",
    parting="#29b6f6",
    nonfinite="#8e24aa",
    error="#d500f9",
    muted="#7a7a7a",
)
"""Truecolor and 256 colours (each colour stays distinct after the 256 downgrade)."""

ANSI16 = Scheme(
    # Rich's own standard palette values, so the downgrade to 16 colours is exact.
    passing=("#aa5500", "#aa5500", "#ffff55", "#00aaaa", "#55ff55", "#00aa00", "#00aa00"),
    fail_bright="#ff5555",
    fail_dark="#aa0000",
    diverged="#555555",
    parting="#55ffff",
    nonfinite="#aa00aa",
    error="#ff55ff",
    muted="#555555",
    dark_text="#000000",
    light_text="#ffffff",
)
"""16 colours: fewer bands survive, so the digits in the cell carry the rest."""


def _is_light(colour: str) -> bool:
    r, g, b = Color.parse(colour).get_truecolor()
    return 0.299 * r + 0.587 * g + 0.114 * b > 110


def _on(scheme: Scheme, background: str, **extra: bool) -> Style:
    text = scheme.dark_text if _is_light(background) else scheme.light_text
    return Style(color=text, bgcolor=background, **extra)


def _style(scheme: Scheme, state: int, q: int) -> Style:
    if state in (CellState.EMPTY, CellState.WAITING):
        return Style(color=scheme.muted)
    if state == CellState.NONFINITE:
        return _on(scheme, scheme.nonfinite, bold=True)
    if state == CellState.ERROR:
        return _on(scheme, scheme.error, bold=True)
    if state == CellState.DIVERGED and q == Q_PARTING:
        return _on(scheme, scheme.parting, bold=True)
    if state == CellState.DIVERGED:
        return _on(scheme, scheme.diverged)
    if state == CellState.FAIL:
        low = q == Q_VERDICT or (q != Q_UNKNOWN and band(q) < 2)
        return _on(scheme, scheme.fail_bright if low else scheme.fail_dark, bold=True)
    if q == Q_UNKNOWN:
        return Style(color=scheme.muted)
    return _on(scheme, scheme.passing[band(q)])


def cell_styles(scheme: Scheme) -> list[Style]:
    """One precomputed Style per code (never parse or build a Style per cell per frame)."""
    return [_style(scheme, c // CODES_PER_STATE, c % CODES_PER_STATE) for c in range(N_CODES)]


def scheme_for(color_system: str | None) -> Scheme:
    return ANSI16 if color_system in ("standard", "windows") else RGB


# --- legend --------------------------------------------------------------------------------
def verdict_legend_entries() -> list[tuple[str, str, int]]:
    """(glyph, meaning, code) for the scan grid: verdicts only, no metric scale."""
    return [
        ("✓", "clean", CellState.PASS * CODES_PER_STATE + Q_VERDICT),
        ("✖", "appears here", CellState.FAIL * CODES_PER_STATE + Q_VERDICT),
        ("NaN", "NaN/Inf", CellState.NONFINITE * CODES_PER_STATE),
        ("≠", "carried in", CellState.DIVERGED * CODES_PER_STATE + Q_UNKNOWN),
        ("…", "landing", CellState.WAITING * CODES_PER_STATE),
        ("·", "not dumped", CellState.EMPTY * CODES_PER_STATE),
    ]


def legend_entries(metric: str) -> list[tuple[str, str, int]]:
    """(glyph, meaning, code) for the legend: the bands best first, then the states."""
    if metric == COSINE:
        meanings = ["=1", "≥.99999", ".9999", ".999", ".99", ".9", "<.9"]
    else:
        meanings = ["=0", "≤1e-5", "1e-4", "1e-3", "1e-2", "1e-1", ">.1"]
    pass_code = CellState.PASS * CODES_PER_STATE
    bands = [("=", Q_EXACT), ("5", 50), ("4", 40), ("3", 30), ("2", 20), ("1", 10), ("0", 0)]
    entries = [
        (glyph, meaning, pass_code + q) for (glyph, q), meaning in zip(bands, meanings, strict=True)
    ]
    entries += [
        ("fail", "fail", CellState.FAIL * CODES_PER_STATE + 30),
        ("»", "parts", PARTING_CODE),
        ("≠", "not compared", CellState.DIVERGED * CODES_PER_STATE + Q_UNKNOWN),
        ("NaN", "NaN/Inf", CellState.NONFINITE * CODES_PER_STATE),
        ("ERR", "ERR", CellState.ERROR * CODES_PER_STATE),
        ("…", "one side", CellState.WAITING * CODES_PER_STATE),
        ("·", "not dumped", CellState.EMPTY * CODES_PER_STATE),
    ]
    return entries
