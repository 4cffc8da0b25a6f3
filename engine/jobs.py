"""Running pair comparisons: inline, or in a process pool when there is enough work.

A pool round trip costs ~0.1-0.3 ms and a forked worker a few ms, so the pool is used only with
``jobs > 1`` and at least two big pairs (``big_bytes`` of golden + target payload: one per task,
largest first, while the small pairs run inline) or, with no big pairs, a few hundred small ones
(in batches, so the per-task cost is paid once per batch). A live session's flushes are usually
small and stay inline, where the per-pair cost is the metric itself.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from layerwatch.capture.errors import LayerwatchError

from .records import PairResult, TensorRecord, Verdict

if TYPE_CHECKING:
    from concurrent.futures import Executor, Future

SMALL_BATCH = 64
"""Small pairs per pool task."""
MIN_SMALL_FOR_POOL = 256
"""Fewer small pairs than this (and no big ones) are compared inline."""

CompareFn = Callable[..., PairResult]
"""``compare(golden, target, thresholds, *, is_logits=False) -> PairResult`` (picklable)."""


@dataclass(frozen=True, slots=True)
class Work:
    golden: TensorRecord
    target: TensorRecord
    is_logits: bool

    @property
    def nbytes(self) -> int:
        return _nbytes(self.golden) + _nbytes(self.target)


def _nbytes(record: TensorRecord) -> int:
    return record.loc.nbytes if record.loc is not None else 0


def run_one(compare: CompareFn, thresholds: object, work: Work) -> PairResult:
    """Compare one pair; a crash in the metric code becomes an ERROR verdict, never a traceback."""
    try:
        return compare(work.golden, work.target, thresholds, is_logits=work.is_logits)
    except LayerwatchError as exc:
        message = str(exc)
    except Exception as exc:  # a bug or an unreadable payload: report it on the pair
        message = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return _error(work, message)


def run_many(compare: CompareFn, thresholds: object, works: list[Work]) -> list[PairResult]:
    """One pool task: several pairs, results in order."""
    return [run_one(compare, thresholds, w) for w in works]


def rejudge(work: Work, base: PairResult, thresholds: object) -> PairResult:
    """The result for ``work`` from the metrics of a pair over the very same payloads: only the
    verdict is recomputed, since thresholds may differ per node (overrides) and per stem."""
    verdict, failed, reason = base.verdict, base.failed, base.reason
    judge = getattr(thresholds, "judge", None)
    if base.verdict is not Verdict.ERROR and judge is not None:
        verdict, failed, reason = judge(
            base.metrics,
            node=work.golden.key.node,
            golden_dtype=work.golden.dtype,
            target_dtype=work.target.dtype,
            is_logits=work.is_logits,
            stem=work.golden.key.stem,
        )
    return PairResult(
        work.golden.key,
        verdict,
        base.metrics,
        tuple(failed),
        reason,
        work.golden,
        work.target,
        node_type=work.golden.node_type or work.target.node_type,
        is_logits=work.is_logits,
    )


def _error(work: Work, message: str) -> PairResult:
    return PairResult(
        work.golden.key,
        Verdict.ERROR,
        reason=message,
        golden=work.golden,
        target=work.target,
        is_logits=work.is_logits,
    )


class JobRunner:
    """Compares batches of pairs; owns the process pool (created on first use)."""

    def __init__(
        self, compare: CompareFn, thresholds: object, jobs: int = 1, big_bytes: int = 1 << 21
    ) -> None:
        self.compare = compare
        self.thresholds = thresholds
        self.jobs = jobs if jobs > 0 else (os.cpu_count() or 1)
        self.big_bytes = big_bytes
        self._pool: Executor | None = None

    def plan(self, work: Sequence[Work]) -> tuple[list[list[int]], list[int]]:
        """(pool tasks, indices compared inline). Big pairs go to the pool one per task, largest
        first, and the small ones run inline meanwhile; with no big pairs but many small ones,
        the small ones go to the pool in batches; otherwise everything runs inline."""
        everything = list(range(len(work)))
        if self.jobs <= 1:
            return [], everything
        big = sorted(
            (i for i, w in enumerate(work) if w.nbytes >= self.big_bytes),
            key=lambda i: -work[i].nbytes,
        )
        small = [i for i, w in enumerate(work) if w.nbytes < self.big_bytes]
        if len(big) >= 2:
            return [[i] for i in big], small
        if len(small) >= MIN_SMALL_FOR_POOL:
            size = max(1, min(SMALL_BATCH, -(-len(small) // (4 * self.jobs))))
            return [[i] for i in big] + [
                small[k : k + size] for k in range(0, len(small), size)
            ], []
        return [], everything

    def run(
        self, work: Sequence[Work], progress: Callable[[int, int], None] | None = None
    ) -> list[PairResult]:
        """Results in the order of ``work``."""
        total = len(work)
        tasks, inline = self.plan(work)
        results: list[PairResult | None] = [None] * total
        futures: dict[Future[list[PairResult]], list[int]] = {}
        if tasks:
            pool = self.pool()
            for task in tasks:
                futures[
                    pool.submit(run_many, self.compare, self.thresholds, [work[i] for i in task])
                ] = task
        done = 0
        for i in inline:
            results[i] = run_one(self.compare, self.thresholds, work[i])
            done += 1
            if progress is not None and (done % 64 == 0 or done == total):
                progress(done, total)
        if futures:
            from concurrent.futures import as_completed

            for future in as_completed(futures):
                task = futures[future]
                try:
                    for i, result in zip(task, future.result(), strict=True):
                        results[i] = result
                except Exception as exc:  # a worker died (out of memory...): report it on the pairs
                    message = f"compare worker failed: {type(exc).__name__}: {exc}".splitlines()[0]
                    for i in task:
                        results[i] = _error(work[i], message)
                done += len(task)
                if progress is not None:
                    progress(done, total)
        return [r for r in results if r is not None]

    def pool(self) -> Executor:
        """The worker processes (started on first use; also used to read dumps in parallel)."""
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # fork is cheapest but unsafe once other threads exist (the live pipeline has some).
            method = (
                "fork" if threading.active_count() == 1 and hasattr(os, "fork") else "forkserver"
            )
            self._pool = ProcessPoolExecutor(
                self.jobs, mp_context=multiprocessing.get_context(method)
            )
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
