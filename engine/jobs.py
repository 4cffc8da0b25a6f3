"""Running pair comparisons: small pairs inline, big ones in a process pool.

A pool round trip costs ~0.1-0.3 ms and a worker start ~0.1 s, so only pairs of at least
``big_bytes`` (golden + target payload) go to the pool, and only when there are several of
them; everything else runs in the calling thread, where the per-pair cost is the metric itself.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from dataclasses import dataclass

from layerwatch.capture.errors import LayerwatchError

from .records import PairResult, TensorRecord, Verdict

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

    def run(
        self, work: Sequence[Work], progress: Callable[[int, int], None] | None = None
    ) -> list[PairResult]:
        """Results in the order of ``work``."""
        results: list[PairResult | None] = [None] * len(work)
        big = [i for i, w in enumerate(work) if w.nbytes >= self.big_bytes] if self.jobs > 1 else []
        if len(big) < 2:
            big = []
        futures: dict[int, Future[PairResult]] = {}
        if big:
            pool = self._get_pool()
            for i in sorted(big, key=lambda i: -work[i].nbytes):
                futures[i] = pool.submit(run_one, self.compare, self.thresholds, work[i])
        done = 0
        total = len(work)
        inline = set(range(len(work))) - set(futures)
        for i in sorted(inline):
            results[i] = run_one(self.compare, self.thresholds, work[i])
            done += 1
            if progress is not None and done % 64 == 0:
                progress(done, total)
        for i, future in futures.items():
            try:
                results[i] = future.result()
            except Exception as exc:  # a worker died (out of memory...): report it on the pair
                w = work[i]
                results[i] = PairResult(
                    w.golden.key,
                    Verdict.ERROR,
                    reason=f"compare worker failed: {type(exc).__name__}: {exc}".splitlines()[0],
                    golden=w.golden,
                    target=w.target,
                    is_logits=w.is_logits,
                )
            done += 1
            if progress is not None:
                progress(done, total)
        if progress is not None:
            progress(total, total)
        return [r for r in results if r is not None]

    def _get_pool(self) -> Executor:
        if self._pool is None:
            import multiprocessing

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
