"""Ask where to write the report; its suffix names the format, as for ``compare -o``."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label

DEFAULT_PATH = "layerwatch-report.csv"


def export_words(parquet: bool) -> str:
    """What the box says, on two lines that fit it (``#export-box``, 70 columns: one line was
    cut at its edge); a scan's report has no Parquet form (engine/scan_report.py)."""
    formats = ".json, .jsonl or .parquet" if parquet else ".json or .jsonl"
    return f"Export the report, the format by its suffix:\n.csv (msit's columns plus verdicts), {formats}"


class ExportScreen(ModalScreen[str | None]):
    BINDINGS: ClassVar = [Binding("escape", "cancel", "cancel", key_display="esc")]

    def __init__(self, default: str = DEFAULT_PATH, *, parquet: bool = True) -> None:
        super().__init__()
        self.default = default
        self.parquet = parquet

    def compose(self) -> ComposeResult:
        with Vertical(id="export-box"):
            yield Label(export_words(self.parquet))
            yield Input(value=self.default, id="export-path")
            yield Label("⏎ write · esc cancel", classes="hint")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)
