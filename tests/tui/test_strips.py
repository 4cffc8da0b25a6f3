"""Strips build their caches on first use and draw what Textual's own strips draw.

tui/strips.py replaces ``Strip.__init__`` so that the seven caches a strip carries are made
only when one of its methods first needs one (a cold repaint built ~470 strips and ~3 300
caches). Every method is checked here against a strip built by Textual's own ``__init__``.
"""

from __future__ import annotations

import gc

from layerwatch.tui import strips
from layerwatch.tui.app import LayerwatchApp
from layerwatch.tui.grid import LayerGrid
from rich.segment import Segment
from rich.style import Style
from support.synthetic import Scenario, SyntheticSource
from textual.cache import FIFOCache
from textual.color import Color
from textual.filter import DimFilter
from textual.strip import Strip

RED, BLUE = Style(color="red", bgcolor="black"), Style(color="blue", bold=True)
SEGMENTS = [Segment("abc", RED), Segment(" ", None), Segment("défg", BLUE), Segment("h", RED)]


def _caches(strip: Strip) -> int:
    return sum(isinstance(o, FIFOCache) for o in gc.get_referents(strip))


def _textual_strip(segments: list[Segment], cell_length: int | None) -> Strip:
    strip = Strip.__new__(Strip)
    strips.TEXTUAL_INIT(strip, segments, cell_length)
    return strip


def _drawn(value: object) -> object:
    if isinstance(value, Strip):
        return (list(value), value.cell_length)
    if isinstance(value, list):
        return [_drawn(v) for v in value]
    return value


def test_a_strip_makes_a_cache_only_when_a_method_needs_one() -> None:
    assert strips.install()
    strip = Strip(SEGMENTS, 9)
    assert _caches(strip) == 0
    crop = strip.crop(1, 5)
    assert _caches(strip) == 1
    assert strip.crop(1, 5) is crop  # the cache is used as before
    strip.divide([2, 6])
    assert _caches(strip) == 2
    assert strips.install()  # a second app: nothing changes


def test_every_method_draws_what_a_strip_of_textual_draws() -> None:
    assert strips.install()
    calls = [
        ("crop", (1, 6)),
        ("crop", (0, 9)),
        ("divide", ([2, 5, 9],)),
        ("apply_style", (Style(italic=True),)),
        ("apply_filter", (DimFilter(), Color(10, 20, 30))),
        ("adjust_cell_length", (12, RED)),
        ("adjust_cell_length", (4,)),
        ("extend_cell_length", (11,)),
        ("crop_extend", (2, 12, BLUE)),
        ("apply_offsets", (3, 4)),
        ("simplify", ()),
        ("text_align", (14, "center")),
    ]
    for cell_length in (9, None):
        ours, theirs = Strip(SEGMENTS, cell_length), _textual_strip(SEGMENTS, cell_length)
        assert _caches(theirs) == 7
        for name, args in calls:
            got, want = getattr(ours, name)(*args), getattr(theirs, name)(*args)
            assert _drawn(got) == _drawn(want), name
            again = getattr(ours, name)(*args)
            assert _drawn(again) == _drawn(want), name
        assert ours.text == theirs.text
        assert ours.cell_length == theirs.cell_length
        assert ours.render(_console()) == theirs.render(_console())
        assert list(ours) == list(theirs) and ours == theirs


def _console():
    from rich.console import Console

    return Console(color_system="truecolor", force_terminal=True, width=80)


def test_a_missing_attribute_is_still_an_attribute_error() -> None:
    assert strips.install()
    strip = Strip(SEGMENTS)
    try:
        strip.no_such_thing  # noqa: B018
    except AttributeError as error:
        assert "no_such_thing" in str(error)
    else:
        raise AssertionError("no AttributeError")
    assert not hasattr(strip, "_not_a_cache")


async def test_a_cold_repaint_of_the_grid_builds_few_caches() -> None:
    """The lines a cold repaint drew carry at most the one cache the compositor used to cut
    them at widget edges (Textual's strips carried seven each)."""
    app = LayerwatchApp(SyntheticSource(Scenario(layers=24, tokens=40)), title="strips")
    async with app.run_test(size=(100, 20)) as pilot:
        await pilot.pause()
        grid = app.screen.query_one(LayerGrid)
        grid._cache.clear()
        app.screen.refresh()
        grid.refresh()
        await pilot.pause()
        drawn = list(grid._cache._lines.values())
        assert len(drawn) >= grid.size.height - 1
        assert sum(_caches(s) for s in drawn) <= len(drawn)
