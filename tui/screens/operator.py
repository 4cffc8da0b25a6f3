"""The operator view: one pair, golden against target, and why it was flagged.

``ResultsView.explain`` loads both tensors again, which can take seconds for a large
tensor, so it runs in a thread worker; the screen shows "loading" until the detail arrives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from layerwatch.engine import wording
from layerwatch.engine.records import PairResult, Verdict
from layerwatch.engine.seam import BlockInfo, Divergence, PairDetail, SideSummary, WeightRow
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from .. import keys
from ..messages import DetailLoaded

if TYPE_CHECKING:
    from ..app import LayerwatchApp

BAR_WIDTH = 20
WIDE = 120
"""From this width on, the sections sit in two columns."""


def _table(*headers: str) -> Table:
    table = Table(
        box=None,
        pad_edge=False,
        padding=(0, 2, 0, 0),
        show_header=True,
        header_style="bold",
        expand=False,
    )
    for header in headers:
        table.add_column(header, no_wrap=True)
    return table


def sides_table(golden: SideSummary | None, target: SideSummary | None) -> Table:
    table = _table("", "golden", "target")

    def stat(side: SideSummary | None, name: str) -> str:
        if side is None or side.stats is None:
            return "–"
        return (
            str(getattr(side.stats, name))
            if name in ("nan", "inf")
            else wording.number(getattr(side.stats, name))
        )

    table.add_row("dtype", golden.dtype if golden else "–", target.dtype if target else "–")
    table.add_row(
        "shape",
        str(tuple(golden.shape)) if golden else "–",
        str(tuple(target.shape)) if target else "–",
    )
    for name in ("min", "max", "mean", "norm", "nan", "inf"):
        g, t = stat(golden, name), stat(target, name)
        style = "bold red" if name in ("nan", "inf") and g != t else ""
        table.add_row(
            name if name not in ("nan", "inf") else name.upper() + " count", g, Text(t, style=style)
        )
    return table


def checks_table(detail: PairDetail) -> Table:
    table = _table("metric", "value", "threshold", "")
    for check in detail.checks:
        limit = "(info)" if check.limit is None else f"{check.op} {wording.number(check.limit)}"
        verdict = (
            Text("✔ pass", style="green") if check.passed else Text("✖ FAIL", style="bold red")
        )
        table.add_row(
            check.name,
            wording.value(check.name, check.value),
            limit,
            verdict if check.limit is not None or not check.passed else "",
        )
    return table


def inputs_table(inputs: list[PairResult]) -> RenderableType:
    if not inputs:
        return Text("no input tensors were dumped for this operator", style="dim")
    metrics = [
        m
        for m in (
            "cosine_similarity",
            "max_absolute_error",
            "mean_relative_error",
            "relative_euclidean_distance",
        )
        if any(m in p.metrics for p in inputs)
    ]
    table = _table("input", "verdict", *(wording.short(m) for m in metrics))
    for pair in inputs:
        style = "green" if pair else "bold red"
        table.add_row(
            pair.key.stem,
            Text(("✔ " if pair else "✖ ") + pair.verdict.value, style=style),
            *(
                Text(
                    wording.value(m, pair.metrics.get(m)),
                    style="bold red" if m in pair.failed else "",
                )
                for m in metrics
            ),
        )
    return table


def weights_table(rows: list[WeightRow]) -> Table:
    """The op's own parameters on both sides (fingerprints); a differing one in bold red."""
    table = _table("parameter", "golden", "target", "")
    for row in rows:
        style = "bold red" if row.differ else ""

        def side(shape: tuple[int, ...], dtype: str, norm: float) -> str:
            return f"{list(shape)} {dtype} norm {wording.number(norm)}"

        table.add_row(
            Text(row.name, style=style),
            side(row.golden_shape, row.golden_dtype, row.golden_norm),
            Text(side(row.target_shape, row.target_dtype, row.target_norm), style=style),
            Text("✖ differ", style="bold red") if row.differ else Text("✔ same", style="green"),
        )
    return table


def _edge(v: float) -> str:
    """A bin edge: log-spaced bins span many decades, so two significant digits."""
    if v == 0:
        return "0"
    return f"{v:.1e}" if abs(v) < 1e-2 or abs(v) >= 1e4 else f"{v:.2g}"


def histogram(detail: PairDetail) -> RenderableType:
    counts, edges = detail.histogram_counts, detail.histogram_edges
    if not counts:
        return Text("no histogram (statistics-only dump, or nothing to compare)", style="dim")
    peak = max(counts) or 1
    table = _table("bin", "", "count")
    for i, count in enumerate(counts):
        lo, hi = edges[i], edges[i + 1] if i + 1 < len(edges) else edges[i]
        bar = "█" * round(BAR_WIDTH * count / peak) if count else ""
        table.add_row(
            f"[{_edge(lo)}, {_edge(hi)})", Text(bar.ljust(BAR_WIDTH), style="cyan"), str(count)
        )
    return table


def worst_table(detail: PairDetail) -> RenderableType:
    if not detail.worst:
        return Text("no element-wise errors (statistics-only, or identical)", style="dim")
    table = _table("index", "golden", "target", "abs err", "rel err")
    for w in detail.worst:
        table.add_row(
            str(tuple(w.index)),
            wording.number(w.golden),
            wording.number(w.target),
            wording.number(w.abs_err),
            wording.number(w.rel_err),
        )
    return table


def parting_text(parted: Divergence, dtype: str) -> Text:
    """Both chosen ids, the golden margin and whether rounding in ``dtype`` explains the flip."""
    text = Text()
    text.append(f"golden chose {parted.golden_id} · target chose {parted.target_id}\n")
    if parted.golden_margin is None:
        text.append("golden margin: – (logits not captured)", style="dim")
        return text
    text.append(f"golden margin (top-1 − top-2): {wording.number(parted.golden_margin)}\n")
    if parted.near_tie:
        text.append(f"a near tie for {dtype}: rounding can flip it", style="bold yellow")
    else:
        text.append("a confident choice: above the margin bound, a finding", style="bold red")
    return text


def render_detail(
    detail: PairDetail,
    block: BlockInfo | None,
    width: int = 80,
    parted: Divergence | None = None,
) -> RenderableType:
    """The whole view; two columns of sections when the terminal is wide enough. ``parted``
    adds the divergence to the logits of the step where the generated tokens part."""
    result = detail.result
    bad = result.verdict in (Verdict.FAIL, Verdict.ERROR)
    head = Text()
    head.append(f"token {result.key.token} · ", style="bold")
    if result.key.rank:  # a tensor-parallel rank (rank 0 and single processes say nothing)
        head.append(f"rank {result.key.rank} · ", style="bold")
    if block is not None:
        head.append(f"{wording.block_words(block)} · ", style="bold")
    head.append(
        f"{wording.relative_node(result.key.node, block)} · {result.key.stem}", style="bold"
    )
    head.append("  ")
    head.append(
        f" {result.verdict.value.upper()} ",
        style="bold reverse red" if bad else "bold reverse green",
    )
    head.append(f"\n{result.key.node}", style="dim")
    why = Text(detail.sentence or result.reason or "", style="bold red" if bad else "green")
    files = Text()
    for side, summary in (("golden", detail.golden), ("target", detail.target)):
        files.append(f"{side:<7}", style="bold")
        files.append(f"{summary.source if summary and summary.source else '–'}\n")

    def section(title: str) -> Text:
        return Text(f"\n{title}", style="bold underline")

    left: list[RenderableType] = []
    if parted is not None and result.is_logits and result.key.token == parted.token:
        dtype = result.target.dtype if result.target else "the target"
        left += [section("where the outputs part"), parting_text(parted, dtype)]
    if any(row.differ for row in detail.weights):  # a conversion bug, not a kernel bug
        left += [section("weights differ from the golden's"), weights_table(detail.weights)]
    left += [
        section("golden vs target"),
        sides_table(detail.golden, detail.target),
        section("metrics against thresholds"),
        checks_table(detail),
        section("inputs of this operator"),
        inputs_table(detail.inputs),
    ]
    right = [
        section("error histogram"),
        Text(detail.histogram_label, style="dim"),
        histogram(detail),
        section("worst elements"),
        worst_table(detail),
    ]
    if width < WIDE:
        return Group(head, Text(""), why, *left, *right, section("files"), files)
    columns = Table.grid(padding=(0, 4, 0, 0))
    columns.add_column()
    columns.add_column()
    columns.add_row(Group(*left), Group(*right))
    return Group(head, Text(""), why, columns, section("files"), files)


class OperatorScreen(Screen[None]):
    BINDINGS: ClassVar = keys.bindings("operator")

    app: LayerwatchApp

    def __init__(self, result: PairResult, block: BlockInfo | None) -> None:
        super().__init__()
        self.result, self.block = result, block
        self.detail: PairDetail | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="detail-scroll"):
            yield Static(id="detail")
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        key = self.result.key
        self.query_one("#detail", Static).update(
            Text(
                f"token {key.token} · {key.node} · {key.stem}\n\nloading both tensors…", style="dim"
            )
        )
        self.query_one("#detail-scroll").focus()
        self.explain()

    @work(thread=True, exclusive=True, group="explain")
    def explain(self) -> None:
        try:
            detail = self.app.source.view.explain(self.result)
        except Exception as exc:  # an unreadable file must not take the app down
            self.post_message(DetailLoaded(None, error=str(exc) or type(exc).__name__))
            return
        self.post_message(DetailLoaded(detail))

    @on(DetailLoaded)
    def _loaded(self, message: DetailLoaded) -> None:
        message.stop()
        static = self.query_one("#detail", Static)
        if message.detail is None:
            static.update(
                Text(f"could not build the operator view: {message.error}", style="bold red")
            )
            return
        self.detail = message.detail
        static.update(
            render_detail(message.detail, self.block, self.size.width, self.app.state.divergence)
        )

    def on_resize(self) -> None:
        if self.detail is not None:
            self.query_one("#detail", Static).update(
                render_detail(self.detail, self.block, self.size.width, self.app.state.divergence)
            )

    def action_scroll_down(self) -> None:
        self.query_one("#detail-scroll").scroll_down(animate=False)

    def action_scroll_up(self) -> None:
        self.query_one("#detail-scroll").scroll_up(animate=False)

    def action_back(self) -> None:
        self.app.pop_screen()
