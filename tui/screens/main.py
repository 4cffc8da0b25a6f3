"""The main screen: status lines, the grid, the cell summary, the legend, the Footer."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Footer, Input, Label
from textual.worker import get_current_worker

from .. import keys
from ..grid import LayerGrid
from ..grid_model import Changed
from ..messages import (
    CellChosen,
    CellPairsLoaded,
    CursorMoved,
    ExportFinished,
    FollowChanged,
    RankCellsLoaded,
)
from ..state import Tick
from ..status import Legend, StatusBar
from ..summary import CellSummary

if TYPE_CHECKING:
    from ..app import LayerwatchApp


class MainScreen(Screen[None]):
    """Owns the grid; the app's drain hands it every tick through :meth:`apply_tick`."""

    BINDINGS: ClassVar = keys.bindings("main")
    AUTO_FOCUS = "#grid"

    app: LayerwatchApp

    def compose(self) -> ComposeResult:
        yield StatusBar(self.app.title_text, id="status")
        with Horizontal(id="body"):
            yield LayerGrid(self.app.model, id="grid")
            yield CellSummary(id="summary")
        with Horizontal(id="filter-bar"):
            yield Label("columns matching", id="filter-label")
            yield Input(
                placeholder="words in block labels or module names · ⏎ keep · esc clear",
                id="filter",
            )
        yield Legend(id="legend")
        yield Footer(show_command_palette=False)

    @property
    def grid(self) -> LayerGrid:
        return self.query_one(LayerGrid)

    def on_mount(self) -> None:
        self.query_one(Legend).show(self.app.model.metric)
        self.refresh_status()
        self.show_cursor_cell()
        if self.app.state.done:  # a finished comparison drained before this screen mounted
            self.call_after_refresh(self.show_answer)

    # --- live updates (called by the app's drain, on the UI thread) -------------------------
    def apply_tick(self, tick: Tick, changed: Changed, marked_rows: list[int]) -> None:
        grid = self.grid
        if tick.blocks is not None:
            grid.columns_changed()
        else:
            grid.data_changed(changed, rows=marked_rows)
        if tick.status_changed:
            self.refresh_status()
        if tick.finished:
            self.show_answer()
        cursor = (changed.tokens == grid.cursor_row) & (changed.blocks == grid.cursor_block)
        if cursor.any() or marked_rows or tick.blocks is not None:
            self.show_cursor_cell()

    def show_answer(self) -> None:
        """Nothing more will come: put the cursor on the first failure, unless the user
        already went elsewhere (follow mode was switched off by moving)."""
        grid, first = self.grid, self.app.state.first_failure
        if grid.following and first is not None and first.block >= 0:
            grid.set_following(False)
            self._jump(first.token, first.block)
            self.refresh_status()

    def refresh_status(self) -> None:
        bar = self.query_one(StatusBar)
        bar.rank_text = self._rank_words()
        bar.show(self.app.state, self.app.model.blocks, self.grid.following)

    def show_cursor_cell(self) -> None:
        grid = self.grid
        info = self.app.model.cell(grid.cursor_row, grid.cursor_col)
        summary = self.query_one(CellSummary)
        keep = (
            summary.pairs
            if summary.info
            and info
            and (summary.info.token, summary.info.block) == (info.token, info.block)
            and summary.info == info
            else None
        )
        summary.show(info, keep)
        if info is not None and keep is None and info.pairs:
            self.load_cell_pairs(info.token, info.block.index)

    @work(thread=True, exclusive=True, group="cell-pairs")
    def load_cell_pairs(self, token: int, block: int) -> None:
        """Fetch the cursor cell's pairs off the UI thread (the session may be busy)."""
        time.sleep(0.05)  # a held arrow key moves on before this fires: skip stale cells
        if get_current_worker().is_cancelled:
            return
        rank = self.app.rank
        try:
            pairs = self.app.source.view.pairs_in_block(token, block)
        except Exception as exc:  # a drill-down query must never take the app down
            self.post_message(CellPairsLoaded(token, block, [], error=str(exc)))
            return
        if rank is not None:
            pairs = [p for p in pairs if p.key.rank == rank]
        self.post_message(CellPairsLoaded(token, block, pairs))

    @on(CellPairsLoaded)
    def _pairs_loaded(self, message: CellPairsLoaded) -> None:
        summary = self.query_one(CellSummary)
        info = summary.info
        if info is not None and (info.token, info.block.index) == (message.token, message.block):
            summary.show(info, message.pairs)

    @on(CursorMoved)
    def _cursor_moved(self) -> None:
        self.show_cursor_cell()

    @on(FollowChanged)
    def _follow_changed(self) -> None:
        self.refresh_status()

    @on(CellChosen)
    def _cell_chosen(self, message: CellChosen) -> None:
        from .block import BlockScreen

        self.app.push_screen(BlockScreen(message.token, message.block))

    # --- actions ---------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The scan grid has no golden: no parting step, no metric, no ranks to pick, so those
        keys are neither shown in the Footer nor run (tui/keys.py ``compare_only``)."""
        return not (self.app.model.verdict_only and action in keys.COMPARE_ONLY)

    def _jump(self, token: int, block: int) -> None:
        model, grid = self.app.model, self.grid
        col = model.column_of(block)
        if col is None:
            self._set_filter("")
            col = model.column_of(block) or 0
        grid.move_cursor(token, col)

    def action_first_failure(self) -> None:
        first = self.app.state.first_failure
        if first is None or first.block < 0:
            self.notify("No failure so far.", timeout=3)
            return
        self._jump(first.token, first.block)

    def action_parting(self) -> None:
        parted = self.app.state.divergence
        if parted is None:
            self.notify("The outputs have not parted.", timeout=3)
            return
        self._jump(parted.token, self.app.model.n_blocks - 1)  # the logits: the last block

    def _step_failure(self, step: int) -> None:
        grid = self.grid
        found = self.app.model.next_failure(grid.cursor_row, grid.cursor_col, step)
        if found is None:
            self.notify(f"No {'later' if step > 0 else 'earlier'} failing cell.", timeout=3)
            return
        grid.move_cursor(*found)

    def action_next_failure(self) -> None:
        self._step_failure(1)

    def action_previous_failure(self) -> None:
        self._step_failure(-1)

    def action_cycle_metric(self) -> None:
        model = self.app.model
        model.set_metric(model.metric_index + 1)
        self.query_one(Legend).show(model.metric)
        self.grid.columns_changed()

    def action_toggle_follow(self) -> None:
        grid = self.grid
        grid.set_following(not grid.following)

    def action_filter(self) -> None:
        self.query_one("#filter-bar").add_class("-shown")
        self.query_one("#filter", Input).focus()

    def _set_filter(self, text: str) -> None:
        self.app.model.set_filter(text)
        self.grid.columns_changed()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self._set_filter(event.value)

    @on(Input.Submitted, "#filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        if not event.value.strip():
            self.query_one("#filter-bar").remove_class("-shown")
        self.grid.focus()
        if not len(self.app.model.visible):
            self.notify(
                f"No block matches {event.value!r}.", severity="warning", timeout=4, markup=False
            )

    def action_clear_filter(self) -> None:
        bar, box = self.query_one("#filter-bar"), self.query_one("#filter", Input)
        if bar.has_class("-shown") or self.app.model.filter_text:
            box.value = ""
            bar.remove_class("-shown")
            self._set_filter("")
            self.grid.focus()
        elif self.app.cases is not None:  # one case of several: back to the cases list
            self.app.back_to_cases()

    def action_cycle_rank(self) -> None:
        self.load_rank(stepped=True)

    @work(thread=True, exclusive=True, group="rank")
    def load_rank(self, stepped: bool) -> None:
        """The grid as the next rank (``stepped``) or the current one colours it, off the UI
        thread: it walks every result."""
        view, rank = self.app.source.view, self.app.rank
        try:
            ranks, cells = view.rank_cells(None)
            if stepped:
                later = [r for r in ranks if rank is None or r > rank]
                rank = later[0] if later and len(ranks) > 1 else None
            if rank is not None:
                ranks, cells = view.rank_cells(rank)
        except Exception as exc:  # a drill-down query must never take the app down
            self.post_message(RankCellsLoaded(rank, (), [], stepped, error=str(exc)))
            return
        if get_current_worker().is_cancelled:
            return
        self.post_message(RankCellsLoaded(rank, ranks, cells, stepped))

    @on(RankCellsLoaded)
    def _rank_loaded(self, message: RankCellsLoaded) -> None:
        if message.error:
            self.notify(f"Ranks: {message.error}", severity="error", timeout=6, markup=False)
            return
        app = self.app
        if message.stepped and len(message.ranks) <= 1:
            self.notify("One rank only: nothing to choose.", timeout=3)
            return
        if not message.stepped and message.rank != app.rank:
            return  # the user moved on to another rank meanwhile
        app.rank, app.ranks = message.rank, message.ranks
        app.model.apply(message.cells)
        self.grid.columns_changed()
        self.refresh_status()
        self.show_cursor_cell()
        if message.stepped:
            self.notify(f"Showing {self._rank_words()} (r: next).", timeout=3)

    def _rank_words(self) -> str:
        app = self.app
        if app.rank is None:
            return f"the worst of {len(app.ranks)} ranks" if len(app.ranks) > 1 else ""
        return f"rank {app.rank} of {len(app.ranks)}"

    def action_export(self) -> None:
        from .export import ExportScreen

        scan = self.app.model.verdict_only  # a scan's report: CSV, JSON or JSONL
        self.app.push_screen(ExportScreen(parquet=not scan), self._export_to)

    def _export_to(self, path: str | None) -> None:
        if path:
            self.export_report(path)

    @work(thread=True, exclusive=True, group="export")
    def export_report(self, path: str) -> None:
        try:
            written = self.app.source.export(path)
        except Exception as exc:  # LayerwatchError or OSError: say it in one line
            self.post_message(ExportFinished(path, error=str(exc) or type(exc).__name__))
            return
        self.post_message(ExportFinished(written or path))

    @on(ExportFinished)
    def _exported(self, message: ExportFinished) -> None:
        if message.error:
            self.notify(
                f"Export failed: {message.error}", severity="error", timeout=8, markup=False
            )
        else:
            self.notify(f"Report written to {message.path}", timeout=5, markup=False)
