"""The cell under the cursor in words: a side panel when wide, three lines at 80 columns."""

from __future__ import annotations

from layerwatch.engine import wording
from layerwatch.engine.records import COSINE, PairResult, Verdict
from layerwatch.engine.seam import CellState
from rich.text import Text

from .grid_model import CellInfo
from .status import TextLines

STATE_STYLE = {
    CellState.FAIL: "bold red",
    CellState.NONFINITE: "bold magenta",
    CellState.ERROR: "bold magenta",
    CellState.DIVERGED: "blue",
    CellState.PASS: "green",
}


def pair_words(pair: PairResult, block_node: str, metric: str = COSINE) -> str:
    """``self_attn.o_proj · cos 0.912`` (the stem only when it is not the plain output)."""
    node = pair.key.node
    name = node[len(block_node) + 1 :] if node.startswith(block_node + ".") else "(block output)"
    if pair.key.stem != "output":
        name += f" {pair.key.stem}"
    shown = next(iter(pair.failed), metric)
    if shown in pair.metrics:
        return f"{name} · {wording.short(shown)} {wording.value(shown, pair.metrics[shown])}"
    return f"{name} · {pair.reason or pair.verdict.value}"


class CellSummary(TextLines):
    """Shows a :class:`CellInfo` and, once a worker fetched them, the cell's failing pairs."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.info: CellInfo | None = None
        self.pairs: list[PairResult] | None = None
        self._shown = ""
        self._spans: list = []

    def show(self, info: CellInfo | None, pairs: list[PairResult] | None = None) -> None:
        self.info, self.pairs = info, pairs
        text = self._text()
        if text.plain != self._shown or text.spans != self._spans:
            self._shown, self._spans = text.plain, text.spans
            self.set_text(text)

    def on_resize(self) -> None:
        self.set_text(self._text())

    @property
    def tall(self) -> bool:
        """A side panel (wide terminal, the screen's ``-wide`` breakpoint) or three lines."""
        return self.is_mounted and self.screen.has_class("-wide")

    def _text(self) -> Text:
        info = self.info
        text = Text(no_wrap=True, overflow="ellipsis")
        if info is None:
            if self.is_mounted and self.app.model.verdict_only:  # one run, no golden
                text.append("no cell yet: waiting for tensors", style="dim")
            else:
                text.append(
                    "no cell yet: results appear as both runs write their tensors", style="dim"
                )
            return text
        sep = "\n" if self.tall else " · "
        text.append(f"token {info.token} · {wording.block_words(info.block)}", style="bold")
        if self.tall and info.block.node:
            text.append(f"{sep}{info.block.node}", style="dim")
        text.append("\n" if self.tall else " · ")
        text.append(wording.STATE_WORDS[info.state], style=STATE_STYLE.get(info.state, "dim"))
        if info.pairs:
            text.append(
                f" · {info.failed} of {info.pairs} pairs fail"
                if info.failed
                else f" · {info.pairs} pair{'s' if info.pairs > 1 else ''}"
            )
        if info.first_bad:
            text.append(
                "\n! the first failure" if self.tall else " · ! first failure", style="bold red"
            )
        text.append("\n\n" if self.tall else "\n")
        scan = self.is_mounted and self.app.model.verdict_only  # no metric: verdicts only
        for metric, v in {} if scan else info.values.items():
            if self.tall:
                text.append(f"{wording.short(metric):<10}{wording.value(metric, v)}\n")
            else:
                text.append(f"{wording.short(metric)} {wording.value(metric, v)}  ")
        if not scan or self.tall:
            text.append("\n")
        bad = [p for p in self.pairs or [] if p.verdict in (Verdict.FAIL, Verdict.ERROR)]
        failing = [p for p in bad if p.key.part == "output"] or bad
        if self.pairs is None:
            text.append("…", style="dim")
        elif self.tall:
            if failing:
                text.append(f"failing ({len(failing)}), in execution order\n", style="bold")
                for pair in failing[:8]:
                    text.append("✖ " + pair_words(pair, info.block.node) + "\n", style="red")
                if len(failing) > 8:
                    text.append(f"  … {len(failing) - 8} more\n", style="dim")
        elif failing:
            text.append("first failing: " + pair_words(failing[0], info.block.node), style="red")
        if scan and self.tall:
            carried = sum(p.verdict is Verdict.DIVERGED for p in self.pairs or [])
            if carried:
                text.append(f"≠ {carried} carried in by an input\n", style="blue")
        if self.tall and info.pairs:
            text.append("\n⏎ operators of this block", style="dim")
        elif info.pairs and not failing:
            text.append("⏎ operators of this block", style="dim")
        return text
