"""Words and numbers for people, for every front end: metric names, values, statistics,
cell states, blocks, findings ("first failure: token 5 · layer 3 · ..."), run states, the summary.

The TUI (tui/status.py, summary.py, screens/) and the headless reports (engine/report.py's
callers: engine/outcome.py, tui/frontends.py) both take their words from here, so a change of
wording is made once. Two forms of a finding exist on purpose and are both here: the TUI's
compact status-line form (:func:`finding_brief`) and the report's field-per-part line
(:func:`finding_words`) that ``layerwatch compare`` prints and tests and scripts match.
Reasons inside a verdict are written where the verdict is judged (engine/numerics/thresholds.py),
since numerics imports nothing above records. Plain Python: no numpy, no Textual.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from layerwatch.engine import records as R
from layerwatch.engine.records import COSINE
from layerwatch.engine.seam import BlockInfo, CellState, Divergence, Finding, Summary

if TYPE_CHECKING:
    from layerwatch.engine.seam import RunStatus

# --- figures --------------------------------------------------------------------------------
SHORT: dict[str, str] = {
    R.COSINE: "cos",
    R.RED: "red",
    R.MAX_ABS: "max_abs",
    R.MEAN_ABS: "mean_abs",
    R.MAX_REL: "max_rel",
    R.MEAN_REL: "mean_rel",
    R.KL: "kl",
    R.ONE_THOUSANDTH: "‰1_ok",
    R.FIVE_THOUSANDTHS: "‰5_ok",
    R.NAN_MISMATCH: "nonfinite",
    R.TOP1: "top1",
    R.TOPK: "topk",
    R.MARGIN: "margin",
    R.LOCAL: "local",
    R.INPUT_ERR: "in_red",
}
"""Column and status-line names (msit's full names appear in the operator view)."""

STATE_WORDS: dict[CellState, str] = {
    CellState.EMPTY: "not dumped",
    CellState.WAITING: "one side only (waiting)",
    CellState.PASS: "pass",
    CellState.DIVERGED: "diverged (inputs differ)",
    CellState.FAIL: "FAIL",
    CellState.NONFINITE: "NaN/Inf",
    CellState.ERROR: "error",
}


def short(metric: str) -> str:
    return SHORT.get(metric, metric)


def value(metric: str, v: float | None) -> str:
    """A metric value with as many digits as it needs to show its nines."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if metric in R.HIGHER_IS_BETTER and 0.99 <= v < 1.0:
        places = min(math.ceil(round(-math.log10(1.0 - v), 6)) + 1, 9)
        return f"{v:.{places}f}"
    if v == 0:
        return "0"
    if abs(v) < 1e-3 or abs(v) >= 1e5:
        return f"{v:.2e}"
    return f"{v:.4g}" if abs(v) >= 1 else f"{v:.3f}"


def number(v: float) -> str:
    """A tensor statistic (min/max/mean/norm)."""
    if math.isnan(v) or math.isinf(v):
        return str(v)
    return f"{v:.6g}"


def block_words(block: BlockInfo) -> str:
    """``layer 2`` for a decoder layer, else the block's label."""
    if block.kind == "layer":
        tail = block.node.rsplit(".", 1)[-1]
        return f"layer {tail}" if tail.isdigit() else block.label
    return block.label


def relative_node(node: str, block: BlockInfo | None) -> str:
    """The node name inside its block (``self_attn.o_proj``); the block head itself stays whole."""
    if block is not None and block.node and node.startswith(block.node + "."):
        return node[len(block.node) + 1 :]
    return node.removeprefix("root.")


def finding_brief(finding: Finding, blocks: Sequence[BlockInfo]) -> str:
    """The TUI's status-line form, ``token 3 · layer 2 · self_attn.o_proj · cos 0.912``: the
    stem joined to the node, short metric names, :func:`value`'s digits; the reason when no
    metric failed."""
    block = blocks[finding.block] if 0 <= finding.block < len(blocks) else None
    parts = [f"token {finding.token}"]
    if finding.rank:
        parts.append(f"rank {finding.rank}")
    if block is not None:
        parts.append(block_words(block))
    node = relative_node(finding.node, block)
    if finding.stem != "output":
        node = f"{node} {finding.stem}"
    parts.append(node)
    metric = next(iter(finding.failed_metrics), None)
    if metric is not None and metric in finding.metrics:
        parts.append(f"{short(metric)} {value(metric, finding.metrics[metric])}")
    elif finding.reason:
        parts.append(finding.reason)
    else:
        parts.append(finding.verdict.value)
    return " · ".join(parts)


RUN_GLYPHS = {
    "running": "●",
    "launching": "◌",
    "waiting": "◌",
    "exited": "■",
    "complete": "■",
    "stopped": "■",
    "crashed": "✖",
    "attached": "●",
}


def run_words(run: RunStatus) -> str:
    """ "golden ● running pid 4100 · 5 tok · 812 tensors" (the pipeline's own words when it ended)."""
    glyph = RUN_GLYPHS.get(run.state, "·")
    if run.state in ("exited", "crashed"):
        state = run.message or (
            f"{run.state} {run.exit_code}" if run.exit_code is not None else run.state
        )
        return f"{run.side} {glyph} {state} · {run.tokens} tok · {run.tensors} tensors"
    state = f"running pid {run.pid}" if run.state == "running" and run.pid else run.state
    words = f"{run.side} {glyph} {state} · {run.tokens} tok · {run.tensors} tensors"
    return f"{words} · {run.message}" if run.message else words


def run_progress_words(status: RunStatus) -> str:
    """A run-state change as headless ``run``/``watch`` print it: ``running (pid 4100)``."""
    if status.state == "running" and status.pid:
        return f"running (pid {status.pid})"
    if status.state in ("exited", "crashed") and status.message:
        return status.message
    if status.state == "waiting" and status.message.startswith("waiting"):  # not "waiting: waiting"
        return status.message
    return f"{status.state}{': ' + status.message if status.message else ''}"


# --- the report's lines (headless output, `layerwatch compare`'s summary) --------------------
def _where(finding: Finding, block: BlockInfo | None) -> list[str]:
    if block is None:
        return [finding.node]
    parts = [f"layer {block.label.removeprefix('L')}"] if block.kind == "layer" else [block.label]
    if finding.node.startswith(block.node + "."):
        parts.append(finding.node[len(block.node) + 1 :])
    elif finding.node != block.node:
        parts.append(finding.node)
    return parts


def _value(finding: Finding) -> str:
    names = list(finding.failed_metrics) or ([COSINE] if COSINE in finding.metrics else [])
    for name in names:
        value = finding.metrics.get(name)
        if value is not None:
            label = "cos" if name == COSINE else name
            return f"{label} {value:.4g}" if math.isfinite(value) else f"{label} {value}"
    return finding.verdict.value


def finding_words(finding: Finding, blocks: Sequence[BlockInfo] = ()) -> str:
    """The headless/report form, ``token 3 · layer 2 · self_attn.o_proj · cos 0.912``: every
    part its own field (the stem when it is not ``output``), msit's metric names but ``cos``,
    four significant digits, cosine when no metric failed. :func:`finding_brief` is the TUI's."""
    block = blocks[finding.block] if 0 <= finding.block < len(blocks) else None
    rank = [f"rank {finding.rank}"] if finding.rank else []
    parts = [f"token {finding.token}", *rank, *_where(finding, block)]
    if finding.stem != "output":
        parts.append(finding.stem)
    parts.append(_value(finding))
    return " · ".join(parts)


FOLLOW_HINT = (
    "to compare every step: capture the target with teacher forcing, "
    "layerwatch dump --follow GOLDEN --out DIR -- COMMAND"
)


def _steps(tokens: tuple[int, ...]) -> str:
    if not tokens:
        return "no later step"
    if len(tokens) == 1:
        return f"step {tokens[0]}"
    return f"steps {tokens[0]}–{tokens[-1]}"


def divergence_words(d: Divergence, pairs: int | None) -> str:
    """One sentence: where the outputs part, whether it is a near tie, what was not compared.

    ``pairs`` None: the line is said once while tokens still land (``open --headless``), so it
    names only what later tokens cannot change; the counts so far would differ run to run."""
    if d.golden_margin is None:
        why = "logits not captured: no margin"
    else:
        kind = "a near tie" if d.near_tie else "a confident choice"
        why = f"golden margin {d.golden_margin:.3g}, {kind}"
    head = (
        f"outputs differ from step {d.token}: the target chose {d.target_id}, the golden "
        f"{d.golden_id} ({why}); "
    )
    if pairs is None:
        return head + "the steps after it are not compared"
    return (
        head + f"{_steps(d.not_compared_tokens)} not compared "
        f"({d.not_compared_pairs} of {pairs} pairs)"
    )


def summary_text(session: Any) -> str:
    """The short human summary ``layerwatch compare`` prints without ``-o``/``--json``."""
    s: Summary = session.summary
    blocks = session.blocks()
    lines = []
    parted = getattr(session, "divergence", None)
    if parted is not None:
        lines.append(divergence_words(parted, s.pairs))
        lines.append(f"  {FOLLOW_HINT}")
    bad = session.first_bad_token
    lines.append(f"first bad token: {bad if bad is not None else 'none'}")
    first, cause = session.first_failure, session.root_cause
    lines.append(f"first failure:   {finding_words(first, blocks) if first else 'none'}")
    if cause is not None:
        lines.append(
            f"root cause:      {finding_words(cause, blocks)} ({cause.reason.split(':')[0]})"
        )
    else:
        lines.append("root cause:      none")
    lines.append(
        f"pairs: {s.pairs} compared · {s.passed} pass · {s.failed} fail · {s.diverged} diverged · "
        f"{s.error} error · {s.unpaired} unpaired"
    )
    lines += note_lines(session.notes)
    return "\n".join(lines)


def note_lines(notes: Sequence[str], most: int = 8) -> list[str]:
    """What the readers noted about their input (an index line cut short, a file skipped, an
    unreadable topology), one ``note:`` line each, the first ``most`` and then how many more:
    a dump with thousands of damaged files must not bury the summary. A note said more than
    once (the same bad line in every token) is one line with its count."""
    said = [note if n == 1 else f"{note} ({n} times)" for note, n in Counter(notes).items()]
    lines = [f"note: {note}" for note in said[:most]]
    if len(said) > most:
        lines.append(f"note: … {len(said) - most} more")
    return lines


def stats_only_words(tokens: list[int]) -> str:
    """The status line's note on statistics-only pairs (``tokens`` sorted, not empty)."""
    spans: list[str] = []
    start = prev = tokens[0]
    for t in [*tokens[1:], None]:
        if t is not None and t == prev + 1:
            prev = t
            continue
        spans.append(str(start) if start == prev else f"{start}–{prev}")
        if t is not None:
            start = prev = t
    where = ", ".join(spans[:4]) + (" …" if len(spans) > 4 else "")
    return (
        f"token{'s' if len(tokens) > 1 else ''} {where}: judged on max/min/mean/L2 (msit -st),"
        " ? = no cos/red there"
    )
