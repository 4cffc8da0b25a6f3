"""The cases list: a dump pair with several cases (prompts) opens here, one row per case.

Comparing every case takes a moment, so it runs in a thread worker (``CaseSet.load``) and the
screen says "comparing…" until the rows arrive. Enter opens the case's grid (the usual main
screen over that case's session); Esc there comes back here. A DataTable is fine: tens of rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from layerwatch.engine.seam import CaseRow, CasesView
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from .. import keys
from ..messages import CasesLoaded

if TYPE_CHECKING:
    from ..app import LayerwatchApp

VERDICT_STYLES = {
    "pass": ("✔ pass", "green"),
    "fail": ("✖ FAIL", "bold red"),
    "diverged": ("≠ diverged", "blue"),
    "empty": ("– empty", "dim"),
    "unpaired": ("? unpaired", "yellow"),
}


class CasesScreen(Screen[None]):
    BINDINGS: ClassVar = keys.bindings("cases")
    AUTO_FOCUS = "#cases"

    app: LayerwatchApp

    def __init__(self, cases: CasesView) -> None:
        super().__init__()
        self.cases = cases
        self.rows: list[CaseRow] = []

    def compose(self) -> ComposeResult:
        yield Static(id="cases-title")
        yield DataTable(id="cases", cursor_type="row", zebra_stripes=True)
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        self._title("comparing every case…")
        self.load()

    def _title(self, line: str, style: str = "dim") -> None:
        title = Text(no_wrap=True, overflow="ellipsis")
        title.append(self.app.title_text, style="bold")
        title.append(f"\n{line}", style=style)
        self.query_one("#cases-title", Static).update(title)

    @work(thread=True, exclusive=True, group="cases")
    def load(self) -> None:
        try:
            rows = self.cases.load()
        except Exception as exc:  # LayerwatchError or unreadable bytes: one line on screen
            self.post_message(CasesLoaded([], error=str(exc) or type(exc).__name__))
            return
        self.post_message(CasesLoaded(rows))

    @on(CasesLoaded)
    def _loaded(self, message: CasesLoaded) -> None:
        message.stop()
        if message.error:
            self._title(f"cannot compare the cases: {message.error}", "bold red")
            return
        self.rows = message.rows
        bad = self.cases.failing
        pairs = sum(r.pairs for r in self.rows)
        self._title(
            f"{len(self.rows)} cases · {bad} failing · {pairs} pairs · ⏎ opens a case's grid",
            "bold red" if bad else "green",
        )
        table = self.query_one(DataTable)
        table.clear(columns=True)
        table.add_columns("case", "verdict", "first bad token", "failed/pairs", "first failure")
        for row in self.rows:
            words, style = VERDICT_STYLES.get(row.verdict, (row.verdict, ""))
            table.add_row(
                Text(row.key, style="bold"),
                Text(words, style=style),
                "–" if row.first_bad_token is None else str(row.first_bad_token),
                f"{row.failed}/{row.pairs}",
                row.first_failure or "–",
                key=row.key,
            )
        first_bad = next((i for i, r in enumerate(self.rows) if r.verdict == "fail"), 0)
        table.move_cursor(row=first_bad)

    @on(DataTable.RowSelected, "#cases")
    def _selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.open_row(event.cursor_row)

    def action_open_case(self) -> None:
        self.open_row(self.query_one(DataTable).cursor_row)

    def open_row(self, index: int) -> None:
        if not 0 <= index < len(self.rows):
            return
        row = self.rows[index]
        if row.verdict in ("unpaired", "empty"):
            self.notify(f"Case {row.key} has nothing to compare ({row.verdict}).", timeout=4)
            return
        self.app.open_case(row.key)

    def action_next_failure(self) -> None:
        self._step(1)

    def action_previous_failure(self) -> None:
        self._step(-1)

    def _step(self, step: int) -> None:
        table = self.query_one(DataTable)
        n = len(self.rows)
        for i in range(1, n):
            j = table.cursor_row + step * i
            if 0 <= j < n and self.rows[j].verdict == "fail":
                table.move_cursor(row=j)
                return
        self.notify(f"No {'later' if step > 0 else 'earlier'} failing case.", timeout=3)
