"""The status bar says where the outputs part, in the engine's own words (engine/wording.py)."""

from __future__ import annotations

from layerwatch.engine.seam import Divergence, Summary
from layerwatch.engine.wording import divergence_words
from layerwatch.tui.state import RunState
from layerwatch.tui.status import StatusBar


def test_status_bar_shows_the_divergence_sentence() -> None:
    parted = Divergence(2, 501, 515, 0.047, True, (3, 4, 5), 780)
    state = RunState(summary=Summary(pairs=936, passed=156, diverged=780), divergence=parted)
    bar = StatusBar("layerwatch · test")
    bar._state = state
    text = bar._text(200).plain
    words = divergence_words(parted, 936)
    assert words in text
    assert words.startswith("outputs differ from step 2: the target chose 515, the golden 501")
    assert "a near tie" in words and "steps 3–5 not compared (780 of 936 pairs)" in words
    live = divergence_words(parted, None)
    assert live.startswith(words.split(";")[0]) and "pairs" not in live and "3–5" not in live
    bar._state = RunState(summary=Summary(pairs=10, passed=10))
    assert "outputs differ" not in bar._text(200).plain
