"""engine/wording.py: the words the TUI and the headless reports share."""

from __future__ import annotations

import math

import pytest
from layerwatch.engine import wording
from layerwatch.engine.records import COSINE, MAX_ABS, Verdict
from layerwatch.engine.seam import BlockInfo, Finding, RunStatus

BLOCKS = (
    BlockInfo(0, "embed", "pre", "root.tok_embeddings"),
    BlockInfo(1, "L0", "layer", "root.layers.0"),
    BlockInfo(2, "L1", "layer", "root.layers.1"),
)


def _finding(stem: str = "output", failed: tuple[str, ...] = (COSINE,)) -> Finding:
    metrics = {COSINE: 0.91234, MAX_ABS: 3.5}
    return Finding(5, "root.layers.1.attention.cache", stem, Verdict.FAIL, failed, metrics, 2)


@pytest.mark.parametrize(
    ("metric", "v", "text"),
    [
        (COSINE, 0.999871, "0.99987"),
        (COSINE, 0.9999994, "0.99999940"),
        (COSINE, 0.5, "0.500"),
        (MAX_ABS, 0.0, "0"),
        (MAX_ABS, 1.5e-5, "1.50e-05"),
        (MAX_ABS, 12.25, "12.25"),
        (MAX_ABS, math.inf, "inf"),
        (MAX_ABS, None, "–"),
    ],
)
def test_values_keep_their_nines(metric: str, v: float | None, text: str) -> None:
    assert wording.value(metric, v) == text


def test_the_report_line_and_the_tui_line_of_one_finding() -> None:
    assert (
        wording.finding_words(_finding("output_0"), BLOCKS)
        == "token 5 · layer 1 · attention.cache · output_0 · cos 0.9123"
    )
    assert (
        wording.finding_brief(_finding("output_0"), BLOCKS)
        == "token 5 · layer 1 · attention.cache output_0 · cos 0.912"
    )
    # no block known: the whole node name
    assert wording.finding_words(_finding(), ()).startswith("token 5 · root.layers.1.attention")
    assert wording.finding_words(_finding(failed=(MAX_ABS,)), BLOCKS).endswith(
        "max_absolute_error 3.5"
    )
    assert wording.finding_brief(_finding(failed=(MAX_ABS,)), BLOCKS).endswith("max_abs 3.5")


def test_run_states_in_the_status_line_and_in_headless_progress() -> None:
    running = RunStatus("golden", "running", pid=4100, tokens=5, tensors=812)
    assert wording.run_words(running) == "golden ● running pid 4100 · 5 tok · 812 tensors"
    assert wording.run_progress_words(running) == "running (pid 4100)"
    ended = RunStatus("target", "exited", exit_code=3, message="exited with code 3")
    assert wording.run_progress_words(ended) == "exited with code 3"
    assert wording.run_words(ended).startswith("target ■ exited with code 3")
