"""The block view: one block's operators at one token, in execution order.

A DataTable is fine here (tens of rows, mostly static). Each output row carries its inputs'
verdicts beside it, so "inputs pass, output fails" (◆, where the error starts) is visible.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from layerwatch.engine import records as R
from layerwatch.engine import wording
from layerwatch.engine.records import PairResult, Verdict
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from .. import keys
from ..messages import CellPairsLoaded

if TYPE_CHECKING:
    from ..app import LayerwatchApp

METRIC_ORDER = (
    R.COSINE,
    R.MAX_ABS,
    R.MEAN_ABS,
    R.MAX_REL,
    R.MEAN_REL,
    R.RED,
    R.KL,
    R.ONE_THOUSANDTH,
    R.FIVE_THOUSANDTHS,
    R.NAN_MISMATCH,
    R.NAN_GOLDEN,
    R.NAN_TARGET,
    R.INF_GOLDEN,
    R.INF_TARGET,
    R.TOP1,
    R.TOPK,
    R.MARGIN,
)
BAD = (Verdict.FAIL, Verdict.ERROR)
MARKS = {
    Verdict.PASS: ("✔", "green"),
    Verdict.FAIL: ("✖", "bold red"),
    Verdict.ERROR: ("✖", "bold magenta"),
    Verdict.DIVERGED: ("≠", "blue"),
    Verdict.UNPAIRED: ("?", "yellow"),
}


def metric_columns(pairs: list[PairResult]) -> list[str]:
    present = {m for p in pairs for m in p.metrics}
    return [m for m in METRIC_ORDER if m in present] + sorted(present - set(METRIC_ORDER))


def starts_here(pair: PairResult, inputs: list[PairResult], rows: list[PairResult]) -> bool:
    """The output fails while every input passes and nothing inside the node fails: the error
    enters at this operator (a container holding the culprit fails with good inputs too)."""
    if pair.verdict not in BAD or pair.key.part != "output" or not inputs or not all(inputs):
        return False
    inner = pair.key.node + "."
    return not any(r.verdict in BAD and r.key.node.startswith(inner) for r in rows)


class BlockScreen(Screen[None]):
    BINDINGS: ClassVar = keys.bindings("block")

    app: LayerwatchApp

    def __init__(self, token: int, block: int) -> None:
        super().__init__()
        self.token, self.block = token, block
        self.rows: list[PairResult] = []
        self.inputs: dict[int, list[PairResult]] = {}
        self.ranked = False
        """The rows come from several ranks of a tensor-parallel run (a rank column)."""

    @property
    def block_info(self):
        return self.app.model.blocks[self.block]

    def compose(self) -> ComposeResult:
        yield Static(id="block-title")
        yield DataTable(id="ops", cursor_type="row", zebra_stripes=True)
        yield Static(id="op-reason")
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        info = self.block_info
        title = Text(no_wrap=True, overflow="ellipsis")
        title.append(f"token {self.token} · {wording.block_words(info)}", style="bold")
        title.append(f" · {info.node}", style="dim")
        title.append("\nloading operators…", style="dim")
        self.query_one("#block-title", Static).update(title)
        self.load()

    @work(thread=True, exclusive=True, group="block")
    def load(self) -> None:
        view, rank = self.app.source.view, self.app.rank
        try:
            pairs = view.pairs_in_block(self.token, self.block)
            if rank is not None:  # the rank the grid shows (tensor parallel)
                pairs = [p for p in pairs if p.key.rank == rank]
            rows = [p for p in pairs if p.key.part == "output"]
            with_output = {p.key.node for p in rows}
            rows += [p for p in pairs if p.key.node not in with_output]
            rows.sort(key=lambda p: (p.order, p.key.part != "output", p.key.stem, p.key.rank))
            inputs = {i: view.inputs_of(p) for i, p in enumerate(rows) if p.key.part == "output"}
        except Exception as exc:  # a drill-down query must never take the app down
            self.post_message(CellPairsLoaded(self.token, self.block, [], error=str(exc)))
            return
        self.post_message(CellPairsLoaded(self.token, self.block, rows, inputs))

    @on(CellPairsLoaded)
    def _loaded(self, message: CellPairsLoaded) -> None:
        message.stop()
        self.rows, self.inputs = message.pairs, message.inputs
        self._fill_title(message.error)
        table = self.query_one(DataTable)
        table.clear(columns=True)
        metrics = metric_columns(self.rows)
        table.add_column("", key="mark")
        table.add_column("#", key="order")
        table.add_column("operator", key="node")
        self.ranked = len({p.key.rank for p in self.rows}) > 1
        if self.ranked:
            table.add_column("rank", key="rank")
        table.add_column("verdict", key="verdict")
        table.add_column("inputs", key="inputs")
        for metric in metrics:
            table.add_column(wording.short(metric), key=metric)
        root = self.app.state.root_cause
        for i, pair in enumerate(self.rows):
            table.add_row(*self._cells(i, pair, metrics, root), key=str(i))
        table.focus()
        if self.rows:
            table.move_cursor(row=self._initial_row(), animate=False)

    def _fill_title(self, error: str) -> None:
        info = self.block_info
        bad = [p for p in self.rows if p.verdict in BAD]
        title = Text(no_wrap=True, overflow="ellipsis")
        title.append(f"token {self.token} · {wording.block_words(info)}", style="bold")
        if self.app.rank is not None:
            title.append(f" · rank {self.app.rank}", style="bold")
        title.append(f" · {info.node}", style="dim")
        title.append("\n")
        if error:
            title.append(f"could not load the operators: {error}", style="bold red")
        elif not self.rows:
            title.append(
                "no pairs in this block at this token (not dumped, or one side only so far)",
                style="dim",
            )
        else:
            title.append(f"{len(self.rows)} operators in execution order · ", style="")
            title.append(
                f"{len(bad)} fail" if bad else "all pass", style="bold red" if bad else "green"
            )
            title.append(" · ◆ error enters here: inputs pass, output fails", style="dim")
        self.query_one("#block-title", Static).update(title)

    def _cells(self, i: int, pair: PairResult, metrics: list[str], root) -> list[Text | str]:
        inputs = self.inputs.get(i, [])
        is_root = root is not None and (root.token, root.node, root.stem) == (
            pair.key.token,
            pair.key.node,
            pair.key.stem,
        )
        glyph, style = MARKS.get(pair.verdict, ("?", ""))
        if is_root or starts_here(pair, inputs, self.rows):
            glyph, style = "◆", "bold red"
        node = wording.relative_node(pair.key.node, self.block_info)
        if pair.key.node == self.block_info.node:
            node = "(block output)"
        if inputs:
            bad = sum(not p for p in inputs)
            inputs_text = (
                Text(f"✖ {bad}/{len(inputs)}", style="red")
                if bad
                else Text(f"✔ {len(inputs)}", style="green")
            )
        else:
            inputs_text = Text("–", style="dim")
        cells: list[Text | str] = [
            Text(glyph, style=style),
            str(pair.order),
            Text(node if pair.key.stem == "output" else f"{node} [{pair.key.stem}]"),
            *([str(pair.key.rank)] if self.ranked else []),
            Text(pair.verdict.value + (" (root cause)" if is_root else ""), style=style),
            inputs_text,
        ]
        for metric in metrics:
            v = pair.metrics.get(metric)
            if v is None:
                cells.append(Text("–", style="dim"))
            elif metric in pair.failed:
                cells.append(Text(wording.value(metric, v) + " ✖", style="bold red"))
            else:
                cells.append(wording.value(metric, v))
        return cells

    def _initial_row(self) -> int:
        for i, pair in enumerate(self.rows):
            if starts_here(pair, self.inputs.get(i, []), self.rows):
                return i
        return next((i for i, p in enumerate(self.rows) if p.verdict in BAD), 0)

    @on(DataTable.RowHighlighted)
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        if not (0 <= event.cursor_row < len(self.rows)):
            return
        pair = self.rows[event.cursor_row]
        text = Text(no_wrap=True, overflow="ellipsis")
        if pair.reason:
            text.append(pair.reason, style="bold red" if pair.verdict in BAD else "")
            text.append(" · ")
        text.append(f"{pair.key.node} · {pair.key.stem}", style="dim")
        text.append(
            "\n⏎ golden vs target, every threshold, error histogram, worst elements", style="dim"
        )
        self.query_one("#op-reason", Static).update(text)

    @on(DataTable.RowSelected)
    def _selected(self, event: DataTable.RowSelected) -> None:
        from .operator import OperatorScreen

        if 0 <= event.cursor_row < len(self.rows):
            self.app.push_screen(OperatorScreen(self.rows[event.cursor_row], self.block_info))

    # --- actions ---------------------------------------------------------------------------
    def _step(self, step: int) -> None:
        table = self.query_one(DataTable)
        rows = range(table.cursor_row + step, len(self.rows) if step > 0 else -1, step)
        found = next((i for i in rows if self.rows[i].verdict in BAD), None)
        if found is None:
            self.notify(f"No {'later' if step > 0 else 'earlier'} failing operator.", timeout=3)
        else:
            table.move_cursor(row=found)

    def action_next_failure(self) -> None:
        self._step(1)

    def action_previous_failure(self) -> None:
        self._step(-1)

    def action_cursor_down(self) -> None:
        self.query_one(DataTable).action_cursor_down()

    def action_cursor_up(self) -> None:
        self.query_one(DataTable).action_cursor_up()

    def action_back(self) -> None:
        self.app.pop_screen()
