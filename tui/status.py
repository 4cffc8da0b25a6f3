"""The status lines above the grid and the colour legend below it."""

from __future__ import annotations

from collections.abc import Sequence

from layerwatch.engine import wording
from layerwatch.engine.seam import BlockInfo
from rich.style import Style
from rich.text import Text
from textual.widgets import Static

from . import palette
from .state import RunState


class TextLines(Static):
    """A Static whose updates re-layout the screen only when its number of lines changes
    (a layout pass per tick cost ~60 ms at 200×50 while streaming, bench_tui)."""

    _lines = 0

    def set_text(self, text: Text) -> None:
        lines = text.plain.count("\n") + 1
        self.update(text, layout=lines != self._lines)
        self._lines = lines


class StatusBar(TextLines):
    """Title, counts, one line per run (or both on one line when wide), the first failure."""

    def __init__(self, title: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.title_text = title
        self._state: RunState | None = None
        self._blocks: Sequence[BlockInfo] = ()
        self._following = True
        self.rank_text = ""
        """``rank 1 of 2`` while the rank selector shows one rank of a tensor-parallel run."""

    def show(self, state: RunState, blocks: Sequence[BlockInfo], following: bool) -> None:
        self._state, self._blocks, self._following = state, blocks, following
        self.set_text(self._text(self.content_size.width or 78))

    def on_resize(self) -> None:
        if self._state is not None:
            self.set_text(self._text(self.content_size.width))

    def _text(self, width: int) -> Text:
        state = self._state or RunState()
        s = state.summary
        counts = Text()
        counts.append(f"  {s.pairs} pairs ")
        counts.append(f"✔{s.passed} ", style="green")
        counts.append(f"✖{s.failed} ", style="bold red" if s.failed else "")
        if s.diverged:
            counts.append(f"≠{s.diverged} ", style="blue")
        if s.error:
            counts.append(f"ERR {s.error} ", style="bold magenta")
        if s.pending:
            counts.append(f"…{s.pending} waiting ")
        if self.rank_text:
            counts.append(f"· {self.rank_text} (r) ", style="bold")
        counts.append(
            "· done"
            if state.done
            else "· ▶ following (spc)"
            if self._following
            else "· ⏸ paused (spc)",
            style="bold" if not state.done else "",
        )
        # The counts matter more than a long title (``open`` names two paths): cut the title.
        room = max(width - counts.cell_len, 8)
        title = (
            self.title_text if len(self.title_text) <= room else self.title_text[: room - 1] + "…"
        )
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(title, style="bold")
        pad = width - text.cell_len - counts.cell_len
        text.append(" " * max(pad, 0))
        text.append_text(counts)
        runs = [wording.run_words(run) for run in state.runs.values()]
        if runs and sum(len(r) for r in runs) + 3 * (len(runs) - 1) <= width:
            text.append("\n" + "   ".join(runs))
        else:
            for run in runs:
                text.append("\n" + run)
        text.append("\n")
        scan = self.is_mounted and self.app.model.verdict_only  # one run scanned, no golden
        sides = "the run" if scan else "both sides"
        if state.first_failure is not None:
            text.append(" ✖ first failure ", style="bold reverse red")
            text.append(
                " " + wording.finding_brief(state.first_failure, self._blocks), style="bold"
            )
            root = state.root_cause
            if root is not None and (root.token, root.node, root.stem) != (
                state.first_failure.token,
                state.first_failure.node,
                state.first_failure.stem,
            ):
                text.append("   root cause: " + wording.finding_brief(root, self._blocks))
        elif s.pairs and state.done:
            text.append(f" ✔ all {s.passed} compared pairs pass ", style="bold green")
        elif s.pairs:
            text.append(f" ✔ no failure in {s.pairs} pairs so far", style="green")
        elif state.done:
            why = (
                state.notes[-1]
                if state.notes
                else f"no tensor landed{'' if scan else ' on both sides'}"
            )
            text.append(
                f" ✖ nothing to {'scan' if scan else 'compare'} ", style="bold reverse yellow"
            )
            text.append(f" {why}")
        else:
            text.append(f" waiting for tensors from {sides}…", style="dim")
        if state.stats_only_tokens:
            text.append("\n")
            text.append(" ≈ statistics only ", style="bold reverse yellow")
            text.append(" " + wording.stats_only_words(sorted(state.stats_only_tokens)))
        if state.divergence is not None:
            text.append("\n")
            text.append(f" {palette.GLYPH_PARTING} outputs part ", style="bold reverse blue")
            text.append(" " + wording.divergence_words(state.divergence, s.pairs), style="blue")
        return text


class Legend(TextLines):
    """What the colours mean for the selected metric; shorter when the terminal is narrow."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._metric = ""
        self._styles: list[Style] = []

    def show(self, metric: str) -> None:
        self._metric = metric
        self._styles = palette.cell_styles(palette.scheme_for(self.app.color_system))
        self.set_text(self._text(self.content_size.width or 78))

    def on_resize(self) -> None:
        if self._metric:
            self.set_text(self._text(self.content_size.width))

    def _text(self, width: int) -> Text:
        long = self._line(long=True)
        return long if long.cell_len <= width else self._line(long=False)

    def _line(self, *, long: bool) -> Text:
        if self.app.model.verdict_only:
            return self._verdicts(long=long)
        entries = palette.legend_entries(self._metric)
        name = wording.short(self._metric)
        form = "−log10(1−cos)" if name == "cos" else f"−log10({name})"
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(f"{name} {form}: " if long else f"{name} ", style="bold")
        for i, (glyph, meaning, code) in enumerate(entries):
            if not long:
                swatch = f" {glyph} "
            elif glyph in ("NaN", "fail", "ERR"):
                swatch = f" {meaning} "
            else:
                swatch = f" {glyph} {meaning} "
            text.append(swatch, style=self._styles[code])
            if long:
                text.append(" ")
            elif i == 6:
                example = "4=.9999" if name == "cos" else "4=1e-4"
                text.append(f" {example} ", style="dim")
        return text

    def _verdicts(self, *, long: bool) -> Text:
        """The scan grid's legend: verdict marks, no metric scale."""
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append("scan (no golden): " if long else "scan ", style="bold")
        for glyph, meaning, code in palette.verdict_legend_entries():
            swatch = f" {glyph} {meaning} " if long else f" {glyph} "
            text.append(swatch, style=self._styles[code])
            text.append(" " if long else "")
        return text
