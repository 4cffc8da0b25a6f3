"""Ask where to write the report; ``.json`` writes JSON, anything else CSV (as compare)."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label

DEFAULT_PATH = "layerwatch-report.csv"


class ExportScreen(ModalScreen[str | None]):
    BINDINGS: ClassVar = [Binding("escape", "cancel", "cancel", key_display="esc")]

    def __init__(self, default: str = DEFAULT_PATH) -> None:
        super().__init__()
        self.default = default

    def compose(self) -> ComposeResult:
        with Vertical(id="export-box"):
            yield Label("Export the report (msit's columns plus verdicts): .csv, .json or .jsonl")
            yield Input(value=self.default, id="export-path")
            yield Label("⏎ write · esc cancel", classes="hint")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)
