"""The colour scale: separates 0.9999 from 0.999 from 0.99 in every colour system."""

from __future__ import annotations

import numpy as np
import pytest
from layerwatch.engine.records import COSINE, MAX_ABS
from layerwatch.engine.seam import CellState
from layerwatch.tui import palette
from rich.color import Color, ColorSystem
from rich.segment import Segment


def _band_of_cos(cos: float) -> int:
    q = int(palette.quantise(palette.to_error(COSINE, np.array([cos])))[0])
    return palette.band(q)


def test_nines_land_in_different_bands() -> None:
    bands = [_band_of_cos(c) for c in (0.9, 0.99, 0.999, 0.9999, 0.99999)]
    assert bands == [1, 2, 3, 4, 5]
    assert _band_of_cos(0.5) == 0
    assert _band_of_cos(1.0) == 6  # exact


def test_quantise_edge_values() -> None:
    q = palette.quantise(np.array([0.0, -1e-9, np.nan, np.inf, 1e-30, 2.0]))
    assert q.tolist() == [palette.Q_EXACT, palette.Q_EXACT, palette.Q_UNKNOWN, 0, palette.Q_MAX, 0]


def test_error_form_of_each_metric() -> None:
    assert palette.to_error(COSINE, np.array([0.999]))[0] == pytest.approx(1e-3)
    assert palette.to_error(MAX_ABS, np.array([-0.5]))[0] == 0.5


def test_every_cell_text_has_the_cell_width() -> None:
    assert {Segment(t).cell_length for t in palette.CELL_TEXTS} == {palette.CELL_WIDTH}


def test_states_have_their_own_text() -> None:
    code = lambda state, q=30: int(state) * palette.CODES_PER_STATE + q  # noqa: E731
    assert palette.CELL_TEXTS[code(CellState.NONFINITE)].strip() == "NaN"
    assert palette.CELL_TEXTS[code(CellState.ERROR)].strip() == "ERR"
    assert palette.CELL_TEXTS[code(CellState.DIVERGED)].strip() == palette.GLYPH_DIVERGED
    assert palette.CELL_TEXTS[code(CellState.PASS, 42)].strip() == "4.2"
    assert palette.CELL_TEXTS[code(CellState.WAITING)] != palette.CELL_TEXTS[code(CellState.EMPTY)]


@pytest.mark.parametrize(
    ("scheme", "system"),
    [
        (palette.RGB, ColorSystem.TRUECOLOR),
        (palette.RGB, ColorSystem.EIGHT_BIT),
        (palette.ANSI16, ColorSystem.STANDARD),
    ],
)
def test_bands_and_states_stay_apart_after_downgrade(
    scheme: palette.Scheme, system: ColorSystem
) -> None:
    """What a 256- or 16-colour terminal shows for the bands that matter and for each state."""
    styles = palette.cell_styles(scheme)
    pass_code = int(CellState.PASS) * palette.CODES_PER_STATE

    def bg(code: int) -> str:
        colour = styles[code].bgcolor
        assert colour is not None
        return str(Color.parse(colour.name).downgrade(system).get_ansi_codes(foreground=False))

    bands = [bg(pass_code + q) for q in (10, 20, 30, 40)]  # .9 .99 .999 .9999
    assert len(set(bands)) == 4
    states = [
        bg(int(s) * palette.CODES_PER_STATE + 30)
        for s in (CellState.FAIL, CellState.DIVERGED, CellState.NONFINITE)
    ]
    assert len(set(states)) == 3
    assert not set(states) & set(bands)


def test_legend_names_every_state() -> None:
    meanings = [m for _, m, _ in palette.legend_entries(COSINE)]
    for word in (
        "fail",
        "not compared",
        "parts",
        "NaN/Inf",
        "ERR",
        "one side",
        "not dumped",
        ".9999",
        ".999",
        ".99",
    ):
        assert word in meanings
