"""Follow mode scrolls a third of a page at a time, not one line per new token.

Each scroll repaints the whole grid; at one new token per tick that was a full-screen frame
every tick (bench_tui: follow frames median 12.8 ms, p95 39 ms, ~98 KB each). With the jump
ahead, new tokens fill blank lines below the newest one and only their line is drawn.
"""

from __future__ import annotations

import itertools

from layerwatch.tui.grid import LayerGrid
from support.synthetic import Scenario

from .conftest import make_app, wait_until

TOKENS = 60


async def test_following_a_stream_scrolls_by_a_third_of_a_page() -> None:
    app = make_app(Scenario(tokens=TOKENS, fault_token=None), live=True)
    async with app.run_test(size=(80, 24)) as pilot:
        grid = app.screen.query_one(LayerGrid)
        source = app.source
        tops = []
        for n in range(1, TOKENS + 1):
            source.advance(1)
            await wait_until(
                pilot, lambda n=n: app.model.n_tokens == n and grid.cursor_row == n - 1
            )
            await pilot.pause()
            top, height = int(grid.scroll_offset.y), grid.data_height
            assert grid.following
            assert top <= grid.cursor_row < top + height  # the newest token is always on screen
            tops.append(top)
        scrolls = sum(a != b for a, b in itertools.pairwise(tops))
        jump = grid.data_height // 3
        past_first_page = TOKENS - grid.data_height
        # One scroll per new token before; now one per ``jump`` tokens (the first jumps are
        # shorter: the virtual height runs only n/8 rows ahead of a short run).
        assert 0 < scrolls <= past_first_page // 3, (scrolls, tops)
        # Once the user moves, the view keeps to the rows that exist.
        await pilot.press("k")
        assert not grid.following
        await pilot.press("G")
        last_top = app.model.n_tokens + 1 - grid.scrollable_content_region.height
        assert int(grid.scroll_offset.y) <= max(last_top, 0) + jump
