"""The help screen: every key from the action registry, and what the colours mean."""

from __future__ import annotations

from typing import ClassVar

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from .. import keys, palette

COLOURS = (
    "Each cell is one block (embedding, a decoder layer, the final norm, the logits) at one "
    "token, coloured by the worst value of the selected metric (m cycles cos, red, max_abs, "
    "mean_rel, local: the share of its allowance the error an operator adds beyond its "
    "inputs' uses) inside it. The number in the cell is its matching digits, -log10(error): "
    "4 means cos 0.9999 (or an error of 1e-4), 3 means 0.999, 2 means 0.99, = exact. Failed "
    "cells are red whatever the metric; the first failure (earliest token, then earliest in "
    'execution order) also carries "!" in the cell and in the token column.'
)
"""One paragraph: Rich wraps it to the column it gets."""

SCAN_COLOURS = (
    "No golden run: each cell is one block at one token, marked by the anomaly scan's verdict "
    "on its outputs (NaN, Inf, values at the dtype's finite maximum, an all-zero output from "
    "non-zero inputs, a magnitude jump from its inputs). There is no metric to colour by. The "
    "first failure (the first place in execution order where an anomaly appears) also carries "
    '"!" in the cell and in the token column; ⏎ shows each operator\'s statistics.'
)
"""The scan grid's paragraph (``layerwatch run``/``watch`` with one side, ``dump --scan``)."""

SCAN_MEANINGS = {
    "✓": "clean: finite, below the dtype's maximum, no jump",
    "✖": "an anomaly appears here (its inputs are clean)",
    "NaN": "NaN/Inf appears here",
    "≠": "carried in: an input already held the anomaly (shown, not blamed)",
    "…": "landing: more of this block is being written",
    "·": "not dumped",
}


def _keys_tables(scan: bool = False) -> list[RenderableType]:
    parts: list[RenderableType] = []
    for scope, title in keys.SCOPE_TITLES.items():
        table = Table(box=None, show_header=False, padding=(0, 2, 0, 0), pad_edge=False)
        table.add_column("key", style="bold", no_wrap=True, width=8)
        table.add_column("action")
        for action in keys.actions(scope, scan=scan):
            table.add_row(keys.key_text(action), action.help)
        parts += [Text(title, style="bold underline"), table, Text("")]
    table = Table(box=None, show_header=False, padding=(0, 2, 0, 0), pad_edge=False)
    table.add_column("key", style="bold", no_wrap=True, width=8)
    table.add_column("action")
    table.add_row("ctrl+p", "Command palette: every action above by name")
    table.add_row("mouse", "Click a cell to move there, double-click to open it; the wheel scrolls")
    parts += [table, Text("")]
    return parts


def _colours_table(color_system: str | None, scan: bool = False) -> Table:
    styles = palette.cell_styles(palette.scheme_for(color_system))
    table = Table(box=None, show_header=False, padding=(0, 2, 0, 0), pad_edge=False)
    table.add_column("cell", no_wrap=True)
    table.add_column("meaning")
    if scan:
        for glyph, _meaning, code in palette.verdict_legend_entries():
            table.add_row(Text(palette.CELL_TEXTS[code], style=styles[code]), SCAN_MEANINGS[glyph])
        return table
    meanings = {
        "=": "exact match",
        "5": "5+ digits: cos ≥ 0.99999",
        "4": "cos 0.9999",
        "3": "cos 0.999",
        "2": "cos 0.99",
        "1": "cos 0.9",
        "0": "cos below 0.9",
        "fail": "outside a threshold (red whatever the metric)",
        "»": "outputs part: this step's logits chose another token (key d jumps here)",
        "≠": "not compared: the target was fed other tokens from an earlier step on (grey)",
        "NaN": "NaN/Inf where the golden run has none",
        "ERR": "could not compare (shape mismatch, unreadable)",
        "…": "one side has landed, waiting for the other",
        "·": "not dumped",
    }
    for glyph, _meaning, code in palette.legend_entries("cosine_similarity"):
        table.add_row(
            Text(
                palette.CELL_TEXTS[code] if glyph not in ("fail",) else " fail", style=styles[code]
            ),
            meanings[glyph],
        )
    return table


WIDE = 120
"""From this width on, keys and colours sit side by side."""


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar = [
        Binding("escape,q,question_mark,f1", "dismiss", "close", key_display="esc")
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-scroll"):
            yield Static(id="help-text")

    def _content(self, width: int) -> RenderableType:
        scan = self.app.model.verdict_only  # the scan grid: its own keys and marks
        keys_part = Group(Text("keys", style="bold"), Text(""), *_keys_tables(scan))
        colours_part = Group(
            Text("colours", style="bold"),
            Text(""),
            Text(SCAN_COLOURS if scan else COLOURS),
            Text(""),
            _colours_table(self.app.color_system, scan),
        )
        closing = Text("\nesc, q or ? closes this screen", style="dim")
        if width < WIDE:
            return Group(keys_part, colours_part, closing)
        columns = Table.grid(padding=(0, 4, 0, 0))
        columns.add_column(ratio=1)
        columns.add_column(ratio=1)
        columns.add_row(keys_part, colours_part)
        return Group(columns, closing)

    def on_mount(self) -> None:
        scroll = self.query_one("#help-scroll")
        scroll.border_title = "layerwatch help"
        scroll.focus()

    def on_resize(self) -> None:
        self.query_one("#help-text", Static).update(self._content(self.size.width))

    def action_dismiss(self) -> None:
        self.dismiss()
