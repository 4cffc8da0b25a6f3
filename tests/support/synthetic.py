"""A deterministic ComparisonSource built from seeded data: the TUI's test and bench input.

It is a real producer of seam objects (blocks, cell updates, findings, pair results, pair
details) for a Llama-shaped model with one planted fault, computed the way the engine's
contracts describe them, so the TUI can be driven and snapshotted without launching models.
``live=True`` holds the tokens back until :meth:`SyntheticSource.advance` releases them.
"""

from __future__ import annotations

import csv
import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from layerwatch.engine import records as R
from layerwatch.engine.records import PairResult, Stats, TensorKey, TensorRecord, Verdict
from layerwatch.engine.seam import (
    BlockInfo,
    CellState,
    CellUpdate,
    Divergence,
    Finding,
    MetricCheck,
    PairDetail,
    QueueSink,
    ResultBatch,
    RunStatus,
    SideSummary,
    Summary,
    WorstElement,
)

LAYER_OPS = (
    "input_layernorm",
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "self_attn",
    "post_attention_layernorm",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.act_fn",
    "mlp.down_proj",
    "mlp",
    "",
)
COS_LIMIT = 0.999
"""The synthetic threshold: cosine below this fails."""
_STATE = {
    Verdict.PASS: CellState.PASS,
    Verdict.FAIL: CellState.FAIL,
    Verdict.DIVERGED: CellState.DIVERGED,
    Verdict.ERROR: CellState.ERROR,
}


@dataclass(frozen=True)
class Scenario:
    tokens: int = 8
    layers: int = 8
    seed: int = 0
    fault_token: int | None = 3
    """Token where the fault starts; None = a clean run."""
    fault_layer: int = 2
    fault_op: str = "self_attn.o_proj"
    fault_cos: float = 0.912
    diverge_from: int | None = 6
    """First token fed other input ids: step ``diverge_from - 1`` chose another token."""
    parting_margin: float = 0.047
    """Golden top-2 margin at the parting step (a near tie for bf16)."""
    nonfinite: tuple[int, int] | None = None
    """(token, block) where the target has NaN."""
    error: tuple[int, int] | None = None
    """(token, block) whose pair cannot be compared (shape mismatch)."""
    missing_block: int | None = None
    """A block that was never dumped (all tokens EMPTY)."""
    waiting_from_block: int | None = None
    """On the last token, the target has not landed from this block on (WAITING)."""


KITCHEN_SINK = Scenario(nonfinite=(5, 9), error=(4, 0), missing_block=None, waiting_from_block=5)
"""Every cell state on one screen, for snapshots."""


def blocks_for(layers: int) -> tuple[BlockInfo, ...]:
    blocks = [BlockInfo(0, "embed", "pre", "root.model.embed_tokens")]
    blocks += [BlockInfo(i + 1, f"L{i}", "layer", f"root.model.layers.{i}") for i in range(layers)]
    blocks += [
        BlockInfo(layers + 1, "norm", "post", "root.model.norm"),
        BlockInfo(layers + 2, "lm_head", "post", "root.lm_head"),
    ]
    return tuple(blocks)


def metrics_for(err: float, scale: float = 1.0) -> dict[str, float]:
    """A consistent set of metric values for a pair whose ``1 - cos`` is ``err``."""
    root = float(np.sqrt(max(err, 0.0)))
    return {
        R.COSINE: 1.0 - err,
        R.RED: np.sqrt(2.0) * root,
        R.MAX_ABS: 4.0 * root * scale,
        R.MEAN_ABS: 0.8 * root * scale,
        R.MAX_REL: 6.0 * root,
        R.MEAN_REL: root,
        R.ONE_THOUSANDTH: float(np.clip(1.0 - 40 * root, 0, 1)),
        R.FIVE_THOUSANDTHS: float(np.clip(1.0 - 8 * root, 0, 1)),
        R.NAN_MISMATCH: 0.0,
    }


class SyntheticView:
    """ResultsView over the precomputed pairs (thread-safe: read-only after construction)."""

    def __init__(
        self, blocks: tuple[BlockInfo, ...], by_cell: dict[tuple[int, int], list[PairResult]]
    ):
        self._blocks = blocks
        self._by_cell = by_cell
        self.explained: list[TensorKey] = []

    def blocks(self) -> tuple[BlockInfo, ...]:
        return self._blocks

    def pairs_in_block(self, token: int, block: int) -> list[PairResult]:
        return list(self._by_cell.get((token, block), []))

    def inputs_of(self, result: PairResult) -> list[PairResult]:
        return [
            p
            for p in self._by_cell.get((result.key.token, result.block), [])
            if p.key.node == result.key.node and p.key.part == "input"
        ]

    def explain(self, result: PairResult) -> PairDetail:
        self.explained.append(result.key)
        return explain_synthetic(result, self.inputs_of(result))


class SyntheticSource:
    """ComparisonSource over a :class:`Scenario`; everything is decided by the seed."""

    def __init__(self, scenario: Scenario = Scenario(), *, live: bool = False) -> None:
        self.scenario = scenario
        self.sink = QueueSink()
        self.blocks = blocks_for(scenario.layers)
        self.pairs: list[PairResult] = []
        self._by_cell: dict[tuple[int, int], list[PairResult]] = {}
        self._build()
        self.view = SyntheticView(self.blocks, self._by_cell)
        self.live = live
        self.released = 0
        self.started = self.stopped = False
        self.exports: list[str] = []

    # --- ComparisonSource ------------------------------------------------------------------
    def start(self) -> None:
        self.started = True
        self.sink.on_batch(ResultBatch(blocks=self.blocks, runs=self._runs("running")))
        if not self.live:
            self.advance(self.scenario.tokens)

    def stop(self) -> None:
        self.stopped = True

    def export(self, path: str) -> str:
        rows = [p.to_json() for p in self.pairs]
        if path.endswith(".json"):
            Path(path).write_text(
                json.dumps({"summary": self._summary(self.pairs).to_json(), "pairs": rows})
            )
        else:
            with open(path, "w", newline="") as f:
                writer = csv.writer(f)
                writer.writerow(["token", "node", "tensor", "verdict", "cosine_similarity"])
                for p in self.pairs:
                    writer.writerow(
                        [
                            p.key.token,
                            p.key.node,
                            p.key.stem,
                            p.verdict.value,
                            p.metrics.get(R.COSINE),
                        ]
                    )
        self.exports.append(path)
        return path

    # --- feeding ---------------------------------------------------------------------------
    def advance(self, tokens: int = 1) -> None:
        """Release the next ``tokens`` tokens' results into the sink as one batch."""
        start, stop = self.released, min(self.released + tokens, self.scenario.tokens)
        self.released = stop
        landed = [p for p in self.pairs if p.key.token < stop]
        cells = [self._cell(t, b) for t in range(start, stop) for b in range(len(self.blocks))]
        done = stop >= self.scenario.tokens
        first = self._first_failure(landed)
        self.sink.on_batch(
            ResultBatch(
                cells=cells,
                pairs=[p for p in landed if p.key.token >= start],
                summary=self._summary(landed),
                first_failure=first,
                root_cause=first,
                first_bad_token=first.token if first else None,
                divergence=self._divergence(landed, stop),
                runs=self._runs("exited" if done else "running", tokens=stop),
                done=done,
            )
        )

    def _divergence(self, landed: list[PairResult], stop: int) -> Divergence | None:
        """As the session records it: once the first diverged token landed, stable after."""
        at = self.scenario.diverge_from
        if at is None or stop <= at:
            return None
        return Divergence(
            token=at - 1,
            golden_id=501,
            target_id=515,
            golden_margin=self.scenario.parting_margin,
            near_tie=True,
            not_compared_tokens=tuple(range(at, stop)),
            not_compared_pairs=sum(p.verdict is Verdict.DIVERGED for p in landed),
        )

    def _runs(self, state: str, tokens: int = 0) -> dict[str, RunStatus]:
        return {
            side: RunStatus(
                side,
                state,
                pid=None if state == "exited" else 4100 + i,
                exit_code=0 if state == "exited" else None,
                tokens=tokens,
                tensors=tokens * 26 * len(self.blocks),
            )
            for i, side in enumerate(("golden", "target"))
        }

    # --- the data --------------------------------------------------------------------------
    def _build(self) -> None:
        sc = self.scenario
        rng = np.random.default_rng(sc.seed)
        fault_block = sc.fault_layer + 1
        for t in range(sc.tokens):
            for b, block in enumerate(self.blocks):
                if b == sc.missing_block:
                    continue
                nodes = (
                    [block.node]
                    if block.kind != "layer"
                    else [f"{block.node}.{op}" if op else block.node for op in LAYER_OPS]
                )
                pairs: list[PairResult] = []
                upstream_err = None
                for order, node in enumerate(nodes):
                    err = 10 ** -rng.uniform(4.4, 6.2) * (1 + 0.15 * b)
                    bad = sc.fault_token is not None and sc.fault_token <= t and b >= fault_block
                    if bad and (b > fault_block or order >= LAYER_OPS.index(sc.fault_op)):
                        err = 10 ** -rng.uniform(1.3, 2.4)
                    if t == sc.fault_token and b == fault_block and node.endswith(sc.fault_op):
                        err = 1.0 - sc.fault_cos
                    verdict = Verdict.PASS if 1 - err >= COS_LIMIT else Verdict.FAIL
                    if sc.diverge_from is not None and t >= sc.diverge_from:
                        verdict = Verdict.DIVERGED
                    in_err = err if upstream_err is None else upstream_err
                    if block.kind != "pre":
                        pairs.append(
                            self._pair(
                                t,
                                b,
                                node,
                                "input_0",
                                in_err,
                                order,
                                Verdict.PASS if 1 - in_err >= COS_LIMIT else Verdict.FAIL,
                            )
                        )
                    pairs.append(self._pair(t, b, node, "output", err, order, verdict))
                    upstream_err = err
                if (t, b) == sc.nonfinite:
                    out = pairs[-1]
                    out.verdict, out.failed = Verdict.FAIL, (R.NAN_MISMATCH,)
                    out.metrics[R.NAN_MISMATCH], out.metrics[R.NAN_TARGET] = 12.0, 12.0
                    out.reason = "target has 12 NaN where golden has none"
                if (t, b) == sc.error:
                    out = pairs[-1]
                    out.verdict, out.metrics, out.failed = Verdict.ERROR, {}, ()
                    out.reason = "shape mismatch: golden (1, 64) vs target (1, 32)"
                self._by_cell[(t, b)] = pairs
                self.pairs.extend(pairs)

    def _pair(
        self, t: int, b: int, node: str, stem: str, err: float, order: int, verdict: Verdict
    ) -> PairResult:
        metrics = metrics_for(err)
        failed = (R.COSINE,) if verdict is Verdict.FAIL else ()
        key = TensorKey(t, node, stem)
        shape = (1, 1 if t else 5, 64)
        rec = {
            side: TensorRecord(
                key,
                dt,
                shape,
                None,
                Stats(2.5, -2.5, 0.01, 8.0),
                order,
                "Linear",
                f"{side}/cpu_{4100 + i}/data/{t:08d}.safetensors",
            )
            for i, (side, dt) in enumerate((("golden", "float32"), ("target", "bfloat16")))
        }
        reason = "" if verdict is Verdict.PASS else f"cosine_similarity {1 - err:.4f} < {COS_LIMIT}"
        if verdict is Verdict.DIVERGED:
            reason = f"input ids differ from token {self.scenario.diverge_from} on"
        return PairResult(
            key,
            verdict,
            metrics,
            failed,
            reason,
            rec["golden"],
            rec["target"],
            order,
            "Linear",
            b,
            is_logits=node == "root.lm_head",
        )

    def _cell(self, t: int, b: int) -> CellUpdate:
        sc = self.scenario
        pairs = self._by_cell.get((t, b), [])
        if not pairs:
            return CellUpdate(t, b, CellState.EMPTY, (float("nan"),) * 4, 0, 0)
        if t == sc.tokens - 1 and sc.waiting_from_block is not None and b >= sc.waiting_from_block:
            return CellUpdate(t, b, CellState.WAITING, (float("nan"),) * 4, 0, 0)
        state = max(_STATE.get(p.verdict, CellState.PASS) for p in pairs)
        if any(p.metrics.get(R.NAN_MISMATCH) for p in pairs):
            state = max(state, CellState.NONFINITE)
        first = self._first_failure(self.pairs)
        metric_pairs = [p for p in pairs if p.metrics]
        worst = (
            min((p.metrics[R.COSINE] for p in metric_pairs), default=float("nan")),
            *(
                max((p.metrics[m] for p in metric_pairs), default=float("nan"))
                for m in (R.RED, R.MAX_ABS, R.MEAN_REL)
            ),
        )
        return CellUpdate(
            t,
            b,
            state,
            worst,
            len(pairs),
            sum(p.verdict in (Verdict.FAIL, Verdict.ERROR) for p in pairs),
            first is not None and (first.token, first.block) == (t, b),
        )

    def _first_failure(self, pairs: list[PairResult]) -> Finding | None:
        bad = [p for p in pairs if p.verdict in (Verdict.FAIL, Verdict.ERROR)]
        if not bad:
            return None
        first = min(bad, key=lambda p: (p.key.token, p.block, p.order))
        return Finding.of(first, self.blocks[first.block].label)

    @staticmethod
    def _summary(pairs: list[PairResult]) -> Summary:
        count = {v: 0 for v in Verdict}
        for p in pairs:
            count[p.verdict] += 1
        return Summary(
            len(pairs),
            count[Verdict.PASS],
            count[Verdict.FAIL],
            count[Verdict.DIVERGED],
            count[Verdict.UNPAIRED],
            count[Verdict.ERROR],
        )


def explain_synthetic(result: PairResult, inputs: list[PairResult]) -> PairDetail:
    """Seeded golden/target arrays whose cosine matches the pair; the detail computed from them."""
    rng = np.random.default_rng(zlib.crc32(result.key.label().encode()))
    shape = result.golden.shape if result.golden else (1, 64)
    golden = rng.standard_normal(shape)
    err = 1.0 - result.metrics.get(R.COSINE, 1.0)
    noise = rng.standard_normal(shape)
    target = golden + noise * np.sqrt(2 * max(err, 1e-12))
    abs_err = np.abs(target - golden)
    log_err = np.log10(np.maximum(abs_err, 1e-12)).ravel()
    counts, edges = np.histogram(log_err, bins=8)
    flat = np.argsort(abs_err.ravel())[::-1][:5]
    worst = [
        WorstElement(
            tuple(int(i) for i in np.unravel_index(k, shape)),
            float(golden.flat[k]),
            float(target.flat[k]),
            float(abs_err.flat[k]),
            float(abs_err.flat[k] / max(abs(golden.flat[k]), 1e-6)),
        )
        for k in flat
    ]

    def side(a: np.ndarray, rec: TensorRecord | None) -> SideSummary:
        return SideSummary(
            rec.dtype if rec else "float32",
            a.shape,
            Stats(float(a.max()), float(a.min()), float(a.mean()), float(np.linalg.norm(a))),
            rec.source if rec else "",
        )

    checks = [
        MetricCheck(
            R.COSINE,
            result.metrics.get(R.COSINE, float("nan")),
            COS_LIMIT,
            ">=",
            R.COSINE not in result.failed,
        ),
        MetricCheck(R.RED, result.metrics.get(R.RED, float("nan")), None, "<=", True),
        MetricCheck(R.MAX_ABS, result.metrics.get(R.MAX_ABS, float("nan")), None, "<=", True),
    ]
    sentence = (
        f"{result.key.node.rsplit('.', 2)[-2:][-1]} output cosine {1 - err:.3f} is below {COS_LIMIT} "
        "while its inputs match"
        if not result
        else "every metric is within its threshold"
    )
    return PairDetail(
        result,
        side(golden, result.golden),
        side(target, result.target),
        checks,
        inputs,
        [float(e) for e in edges],
        [int(c) for c in counts],
        "log10 |target − golden|",
        worst,
        sentence,
    )
