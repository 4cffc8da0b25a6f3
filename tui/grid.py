"""The token × block grid: a Line-API ScrollView that draws only the visible cells.

A DataTable re-renders every row across every column after any cell update (2–4 s at
1 000 × 300, measured); here ``render_line`` looks up precomputed texts and styles for the
visible slice of one numpy row, and strips are cached per row version. Line 0 is the sticky
block header and every line starts with the sticky token label. Horizontal scrolling moves
by whole columns (``validate_scroll_x`` snaps), so a cell is never cut in half.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from rich.color import Color as RichColor
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.filter import ANSIToTruecolor, LineFilter
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from . import keys, palette
from .grid_model import NOTHING, Changed, GridModel
from .messages import CellChosen, CursorMoved, FollowChanged

COLUMN = palette.CELL_WIDTH + 1
"""Cell text plus a one-character gap, so neighbouring cells of one colour stay apart."""
FOCUS_STYLE = Style(reverse=True, bold=True)
BLURRED_CURSOR_STYLE = Style(underline=True)
FIRST_BAD_STYLE = Style(bold=True, underline=True)
MAX_CELL_REGIONS = 400
"""Above this many changed cells on screen, refresh whole lines instead of cell regions."""
ROW_SLACK = 256
"""The virtual height runs up to this many rows ahead of the newest token: a new token then
repaints its line instead of re-laying-out the screen (a layout pass per tick cost ~60 ms
at 200×50 while streaming; bench_tui)."""


class StripCache:
    """The grid's rendered lines, least recently used dropped first, with no reference cycle.

    Textual's ``LRUCache`` links its entries in a ring of lists: every entry a ``clear()``
    or an eviction drops (a cold repaint drops a screenful: ~50 strips, each with seven
    small caches, ~1 200 objects) stays alive until a cyclic collection finds it, which made
    the collector's full collections more frequent and longer, the repaint's p95 tail
    (bench_scale.py ``--tui``). An ``OrderedDict`` keeps its order in C: dropped strips go
    at once, by reference counting."""

    __slots__ = ("_lines", "maxsize")

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._lines: OrderedDict[tuple, Strip] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lines)

    def get(self, key: tuple) -> Strip | None:
        strip = self._lines.get(key)
        if strip is not None:
            self._lines.move_to_end(key)
        return strip

    def __setitem__(self, key: tuple, strip: Strip) -> None:
        self._lines[key] = strip
        self._lines.move_to_end(key)
        if len(self._lines) > self.maxsize:
            self._lines.popitem(last=False)

    def clear(self) -> None:
        self._lines.clear()


@dataclass(frozen=True, slots=True)
class Frame:
    """What every line of one frame shares, read once per :meth:`LayerGrid.render_lines`:
    ``scrollable_content_region`` alone walks the styles (~20 µs a call, two a line)."""

    width: int
    first: int
    """First visible column."""
    count: int
    """Columns that touch the screen (the last one may be cut)."""
    top: int
    """Row shown on the first line under the header."""
    height: int
    focus: bool


class LayerGrid(ScrollView, can_focus=True, inherit_bindings=False):
    """Rows are tokens, columns are blocks; the cursor cell is drawn reversed."""

    BINDINGS: ClassVar = keys.bindings("grid")
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "layer-grid--header",
        "layer-grid--label",
        "layer-grid--cursor-label",
        "layer-grid--bad-label",
    }
    DEFAULT_CSS = """
    LayerGrid { scrollbar-size: 1 1; }
    LayerGrid > .layer-grid--header { text-style: bold; color: $text-muted; }
    LayerGrid > .layer-grid--label { color: $text-muted; }
    LayerGrid > .layer-grid--cursor-label { text-style: bold reverse; }
    LayerGrid > .layer-grid--bad-label { color: $error; text-style: bold; }
    """

    def __init__(self, model: GridModel, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.model = model
        self.cursor_row = 0
        self.cursor_col = 0
        self.following = True
        """Keep the newest token under the cursor until the user moves."""
        self._cache = StripCache(1024)
        self._cell_styles: list[Style] = []
        self._cell_segments: list[tuple[Segment, Segment]] = []
        self._chrome: dict[str, Style] = {}
        self._base_style = Style()
        self._scheme: palette.Scheme | None = None
        self._label_width = 6
        self._truecolor: tuple[ANSIToTruecolor | None, RichColor | None] = (None, None)
        """The app's ANSI→truecolor filter and the background it was applied with to the
        precomputed styles (:meth:`get_line_filters` then skips it for this widget)."""
        self._frame: Frame | None = None
        self._window: list[list[int]] | None = None
        """Codes of the frame's visible cells, a list a row from ``Frame.top`` (:meth:`_codes`)."""

    # --- styles ----------------------------------------------------------------------------
    def on_mount(self) -> None:
        self._build_styles()
        self.data_changed(layout=True)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        if self.is_mounted:
            self._build_styles()

    def _build_styles(self) -> None:
        """Precompute the cell segments per code and the chrome styles (never per frame:
        ``rich_style`` and component styles walk the DOM, measured at 0.1 ms a call).

        The styles are passed through the app's ANSI→truecolor filter here, once, so that
        :meth:`get_line_filters` can leave it out: applied per frame it rebuilt every segment
        of every new line, about a third of a cold repaint (bench_tui). The result is the
        same: the filter maps each style on its own, and adding bold, reverse or underline
        to a converted style commutes with it."""
        self._scheme = palette.scheme_for(self.app.color_system)
        convert = self._converter()
        base = self._base_style = convert(self.rich_style)
        self._cell_styles = [convert(base + s) for s in palette.cell_styles(self._scheme)]
        gap = Segment(" ", base)
        self._cell_segments = [
            (Segment(text, style), gap)
            for text, style in zip(palette.CELL_TEXTS, self._cell_styles, strict=True)
        ]
        self._chrome = {
            name: convert(self.get_component_rich_style(name))
            for name in (
                "layer-grid--header",
                "layer-grid--label",
                "layer-grid--cursor-label",
                "layer-grid--bad-label",
            )
        }
        self._cache.clear()

    def _converter(self) -> Callable[[Style], Style]:
        """The app's enabled ANSI→truecolor filter as a style function (identity without)."""
        found = [f for f in self.app.get_line_filters() if isinstance(f, ANSIToTruecolor)]
        if not found:
            self._truecolor = (None, None)
            return lambda style: style
        truecolor, background = found[0], self.background_colors[1].rich_color
        self._truecolor = (truecolor, background)
        return lambda style: truecolor.truecolor_style(style, background)

    def get_line_filters(self) -> Sequence[LineFilter]:
        """The app's filters less the ANSI→truecolor one already applied to every style this
        widget draws with (:meth:`_build_styles`); all of them when the styles are stale."""
        filters = super().get_line_filters()
        truecolor, background = self._truecolor
        enabled = next((f for f in filters if isinstance(f, ANSIToTruecolor)), None)
        if enabled is not truecolor:  # ansi_color toggled or the theme replaced the filter
            self.call_later(self._restyle)
            return filters
        if truecolor is None or self.background_colors[1].rich_color != background:
            return filters
        return [f for f in filters if f is not truecolor]

    def _restyle(self) -> None:
        self._build_styles()
        self.refresh()

    # --- geometry --------------------------------------------------------------------------
    @property
    def data_height(self) -> int:
        """Token rows that fit under the header."""
        return max(self.scrollable_content_region.height - 1, 1)

    @property
    def data_columns(self) -> int:
        """Whole columns that fit right of the token labels."""
        return max((self.scrollable_content_region.width - self._label_width) // COLUMN, 1)

    @property
    def first_column(self) -> int:
        return int(self.scroll_offset.x) // COLUMN

    def _last_top(self) -> int:
        """The lowest first row: the newest token on the last line — or, while following, up
        to the third of a page :meth:`scroll_to_cursor` jumps ahead, so the next tokens fill
        blank lines instead of scrolling (a full repaint) at every new token."""
        slack = self.data_height // 3 if self.following else 0
        return max(self.model.n_tokens + 1 - self.scrollable_content_region.height + slack, 0)

    def validate_scroll_y(self, value: float) -> float:
        """Never past the newest token, although the virtual height runs ahead of it."""
        return min(super().validate_scroll_y(value), self._last_top())

    def validate_scroll_target_y(self, value: float) -> float:
        return min(super().validate_scroll_target_y(value), self._last_top())

    def validate_scroll_x(self, value: float) -> float:
        return round(super().validate_scroll_x(value) / COLUMN) * COLUMN

    def validate_scroll_target_x(self, value: float) -> float:
        return round(super().validate_scroll_target_x(value) / COLUMN) * COLUMN

    def _update_virtual_size(self) -> None:
        columns = len(self.model.visible)
        label_width = max(len(str(max(self.model.n_tokens - 1, 0))), 4) + 2
        if label_width != self._label_width:  # 10 000 tokens: every column moves right
            self._label_width = label_width
            self.refresh()
        viewport = self.scrollable_content_region.width
        hidden = max(columns - self.data_columns, 0)
        width = viewport + hidden * COLUMN if hidden else self._label_width + columns * COLUMN
        height = self.virtual_size.height
        if not (self.model.n_tokens < height <= self.model.n_tokens + 1 + ROW_SLACK):
            height = self.model.n_tokens + 1 + min(ROW_SLACK, self.model.n_tokens // 8)
        size = Size(width, height)
        if size != self.virtual_size:
            self.virtual_size = size

    def on_resize(self, event: events.Resize) -> None:
        self._update_virtual_size()
        self._cache.clear()
        self.scroll_to_cursor()

    # --- repainting ------------------------------------------------------------------------
    def data_changed(
        self, changed: Changed = NOTHING, *, rows: Sequence[int] = (), layout: bool = False
    ) -> None:
        """Repaint after the model changed: only the changed cells that are on screen.

        ``rows`` are repainted whole (their label changed: the first-failure mark). Refreshing
        cell regions rather than lines keeps a frame to the cells that changed (a stream of
        re-updates touches every recent row, mostly in columns off screen; bench_tui).
        """
        grew = self.model.n_tokens + 1 > self.virtual_size.height
        if layout or grew:
            self._update_virtual_size()
        if layout:
            self._cache.clear()
            self.refresh()
        else:
            self._refresh_cells(changed)
            for row in rows:
                self.refresh_line(row + 1)
        if self.following and self.model.n_tokens:
            self.move_cursor(self.model.n_tokens - 1, self.cursor_col, user=False)
        else:
            self.clamp_cursor()

    def _refresh_cells(self, changed: Changed) -> None:
        top, height = int(self.scroll_offset.y), self.data_height
        first, count = self.first_column, self.data_columns + 1
        tokens, blocks = changed.tokens, changed.blocks
        on_rows = (tokens >= top) & (tokens < top + height)
        if not on_rows.any():
            return
        cols = self.model.column_index[blocks[on_rows]]
        rows = tokens[on_rows]
        on_screen = (cols >= first) & (cols < first + count)
        rows, cols = rows[on_screen], cols[on_screen]
        if rows.size > MAX_CELL_REGIONS:
            for row in np.unique(rows).tolist():
                self.refresh_line(row + 1)
            return
        x0, y0 = self._label_width - first * COLUMN, 1 - top
        self.refresh(
            *(
                Region(x0 + col * COLUMN, y0 + row, palette.CELL_WIDTH, 1)
                for row, col in zip(rows.tolist(), cols.tolist(), strict=True)
            )
        )

    def columns_changed(self) -> None:
        """The metric, the filter or the column list changed: every cell may differ."""
        self._cache.clear()
        self.data_changed(layout=True)
        self.clamp_cursor()
        self.post_message(CursorMoved(self.cursor_row, self.cursor_col, self.cursor_block))

    def _read_frame(self) -> Frame:
        region = self.scrollable_content_region
        first = int(self.scroll_offset.x) // COLUMN
        data = max(region.width - self._label_width, 0)
        return Frame(
            width=region.width,
            first=first,
            count=max(-(-data // COLUMN), 1),
            top=int(self.scroll_offset.y),
            height=max(region.height - 1, 1),
            focus=self.has_focus,
        )

    def render_lines(self, crop: Region) -> list[Strip]:
        """Read the frame's geometry once for all its lines (see :class:`Frame`)."""
        self._frame = self._read_frame()
        try:
            return super().render_lines(crop)
        finally:
            self._frame = self._window = None

    def _codes(self, row: int, first: int, count: int) -> list[int]:
        """Codes of ``row``'s cells in columns ``first`` to ``first + count``; during a frame,
        the first row not in the strip cache fetches the whole screen's in one numpy call."""
        frame, model = self._frame, self.model
        cols = model.visible[first : first + count]
        if (
            frame is None
            or (first, count) != (frame.first, frame.count)
            or not frame.top <= row < frame.top + frame.height
        ):
            return model.codes[row, cols].tolist()
        if self._window is None:
            bottom = min(frame.top + frame.height, model.n_tokens)
            self._window = model.codes[frame.top : bottom][:, cols].tolist()
        return self._window[row - frame.top]

    def render_line(self, y: int) -> Strip:
        frame = self._frame or self._read_frame()
        width, first, count = frame.width, frame.first, frame.count
        if y == 0:
            key = (
                "header",
                first,
                width,
                self.cursor_col,
                self.model.version,
                len(self.model.visible),
                self._label_width,
            )
            strip = self._cache.get(key)
            if strip is None:
                strip = self._cache[key] = self._header(first, count, width)
            return strip
        row = frame.top + y - 1
        if row >= self.model.n_tokens:
            return Strip.blank(width, self._base_style)
        cursor = self.cursor_col if row == self.cursor_row else -1
        key = (
            row,
            int(self.model.row_version[row]),
            first,
            width,
            cursor,
            self.model.version,
            self.model.first_bad,
            self.model.parting,
            frame.focus,
            self._label_width,
        )
        strip = self._cache.get(key)
        if strip is None:
            strip = self._cache[key] = self._row(row, first, count, width, cursor)
        return strip

    def _fit(self, segments: list[Segment], length: int, width: int) -> Strip:
        """Cut the last partial column or pad to exactly ``width`` cells: the same segments
        as ``Strip.crop(0, width)`` without walking the line from its start."""
        if length > width:
            cut = segments.pop()
            length -= cut.cell_length
            while length > width:
                cut = segments.pop()
                length -= cut.cell_length
            if length < width:
                segments.append(cut.split_cells(width - length)[0])
        elif length < width:
            segments.append(Segment(" " * (width - length), self._base_style))
        return Strip(segments, width)

    def _header(self, first: int, count: int, width: int) -> Strip:
        style = self._chrome["layer-grid--header"]
        cursor_style = self._chrome["layer-grid--cursor-label"]
        segments = [Segment("tok".rjust(self._label_width - 2) + "  ", style)]
        blocks, visible = self.model.blocks, self.model.visible
        last = min(first + count, len(visible))
        for col in range(first, last):
            label = blocks[int(visible[col])].label
            if len(label) > palette.CELL_WIDTH:
                label = label[: palette.CELL_WIDTH - 1] + "…"
            text = label.center(palette.CELL_WIDTH)
            segments.append(Segment(text, cursor_style if col == self.cursor_col else style))
            segments.append(Segment(" ", style))
        return self._fit(segments, self._label_width + (last - first) * COLUMN, width)

    def _row(self, row: int, first: int, count: int, width: int, cursor: int) -> Strip:
        model = self.model
        bad = model.first_bad
        parts = model.parting == row
        mark = "!" if bad is not None and bad[0] == row else " "
        if cursor >= 0:
            label_style = self._chrome["layer-grid--cursor-label"]
        elif parts:  # the parting colour, "!" kept when the flip is also the first failure
            label_style = self._cell_styles[palette.PARTING_CODE]
        else:
            label_style = self._chrome[
                "layer-grid--bad-label" if mark == "!" else "layer-grid--label"
            ]
        if parts and mark == " ":
            mark = palette.GLYPH_PARTING
        segments = [Segment(f"{row:>{self._label_width - 2}}{mark} ", label_style)]
        codes = self._codes(row, first, count)
        table = self._cell_segments
        for code in codes:
            segments.extend(table[code])
        # The two cells that are drawn differently: the first failure and the cursor.
        bad_col = model.column_of(bad[1]) if mark == "!" else None
        special = {
            c for c in (bad_col, cursor) if c is not None and first <= c < first + len(codes)
        }
        for col in special:
            index = 1 + 2 * (col - first)
            code = codes[col - first]
            text, style = palette.CELL_TEXTS[code], self._cell_styles[code]
            if col == bad_col:
                text, style = palette.GLYPH_FIRST_BAD + text[1:], style + FIRST_BAD_STYLE
            if col == cursor:
                focus = self._frame.focus if self._frame else self.has_focus
                style += FOCUS_STYLE if focus else BLURRED_CURSOR_STYLE
            segments[index] = Segment(text, style)
        return self._fit(segments, self._label_width + len(codes) * COLUMN, width)

    def on_focus(self) -> None:
        self.refresh_line(self.cursor_row + 1)

    def on_blur(self) -> None:
        self.refresh_line(self.cursor_row + 1)

    # --- the cursor ------------------------------------------------------------------------
    @property
    def cursor_block(self) -> int:
        visible = self.model.visible
        return int(visible[self.cursor_col]) if 0 <= self.cursor_col < len(visible) else -1

    def clamp_cursor(self) -> None:
        row = min(self.cursor_row, max(self.model.n_tokens - 1, 0))
        col = min(self.cursor_col, max(len(self.model.visible) - 1, 0))
        if (row, col) != (self.cursor_row, self.cursor_col):
            self.move_cursor(row, col, user=False)

    def move_cursor(self, row: int, col: int, *, user: bool = True) -> None:
        """Put the cursor on a visible cell and scroll it into view; a user move stops follow."""
        row = max(0, min(row, self.model.n_tokens - 1))
        col = max(0, min(col, len(self.model.visible) - 1))
        if user and self.following:
            self.set_following(False)
        old_row, old_col = self.cursor_row, self.cursor_col
        self.cursor_row, self.cursor_col = row, col
        if (row, col) == (old_row, old_col):
            self.scroll_to_cursor()
            return
        self.refresh_line(old_row + 1)
        self.refresh_line(row + 1)
        if col != old_col:
            self.refresh(Region(0, 0, self.size.width, 1))
        self.scroll_to_cursor()
        self.post_message(CursorMoved(row, col, self.cursor_block))

    def scroll_to_cursor(self) -> None:
        top, first = int(self.scroll_offset.y), self.first_column
        height, columns = self.data_height, self.data_columns
        if self.cursor_row < top:
            top = self.cursor_row
        elif self.cursor_row >= top + height:
            # Following the newest token: jump a third of a page at a time, so a stream of
            # new tokens scrolls (and repaints every line) every few seconds, not every tick.
            jump = height // 3 if self.following else 0
            top = self.cursor_row - height + 1 + jump
        if self.cursor_col < first:
            first = self.cursor_col
        elif self.cursor_col >= first + columns:
            first = self.cursor_col - columns + 1
        if (top, first * COLUMN) != (int(self.scroll_offset.y), int(self.scroll_offset.x)):
            # force: the tick the rows first overflow, the scrollbar is not laid out yet and
            # an unforced scroll was dropped (the newest token stayed below the screen).
            self.scroll_to(first * COLUMN, top, animate=False, immediate=True, force=True)

    def set_following(self, following: bool) -> None:
        if following != self.following:
            self.following = following
            self.post_message(FollowChanged(following))
        if following and self.model.n_tokens:
            self.move_cursor(self.model.n_tokens - 1, self.cursor_col, user=False)

    def action_cursor_up(self) -> None:
        self.move_cursor(self.cursor_row - 1, self.cursor_col)

    def action_cursor_down(self) -> None:
        self.move_cursor(self.cursor_row + 1, self.cursor_col)

    def action_cursor_left(self) -> None:
        self.move_cursor(self.cursor_row, self.cursor_col - 1)

    def action_cursor_right(self) -> None:
        self.move_cursor(self.cursor_row, self.cursor_col + 1)

    def action_page_up(self) -> None:
        self.move_cursor(self.cursor_row - self.data_height, self.cursor_col)

    def action_page_down(self) -> None:
        self.move_cursor(self.cursor_row + self.data_height, self.cursor_col)

    def action_first_token(self) -> None:
        self.move_cursor(0, self.cursor_col)

    def action_last_token(self) -> None:
        self.move_cursor(self.model.n_tokens - 1, self.cursor_col)

    def action_first_column(self) -> None:
        self.move_cursor(self.cursor_row, 0)

    def action_last_column(self) -> None:
        self.move_cursor(self.cursor_row, len(self.model.visible) - 1)

    def action_open(self) -> None:
        if self.model.n_tokens and self.cursor_block >= 0:
            self.post_message(CellChosen(self.cursor_row, self.cursor_block))

    # --- the mouse -------------------------------------------------------------------------
    def cell_at(self, x: int, y: int) -> tuple[int | None, int | None]:
        """(row, column) under a widget-relative point; None where it is a header or label."""
        row = int(self.scroll_offset.y) + y - 1 if y >= 1 else None
        col = (
            self.first_column + (x - self._label_width) // COLUMN
            if x >= self._label_width
            else None
        )
        return row, col

    def on_mouse_scroll_down(self) -> None:
        self.set_following(False)  # scrolling away is moving: stop pulling the view back

    def on_mouse_scroll_up(self) -> None:
        self.set_following(False)

    def on_click(self, event: events.Click) -> None:
        row, col = self.cell_at(event.x, event.y)
        if row is not None and row >= self.model.n_tokens:
            return
        target = (self.cursor_row if row is None else row, self.cursor_col if col is None else col)
        if col is not None and col >= len(self.model.visible):
            return
        if event.chain >= 2 and target == (self.cursor_row, self.cursor_col):
            self.action_open()
        else:
            self.move_cursor(*target)
