"""Words and numbers for people: metric short names, values, findings, run states."""

from __future__ import annotations

import math
from collections.abc import Sequence

from layerwatch.engine import records as R
from layerwatch.engine.seam import BlockInfo, CellState, Finding, RunStatus

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


def finding_words(finding: Finding, blocks: Sequence[BlockInfo]) -> str:
    """ "token 3 · layer 2 · self_attn.o_proj · cos 0.912"."""
    block = blocks[finding.block] if 0 <= finding.block < len(blocks) else None
    parts = [f"token {finding.token}"]
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
