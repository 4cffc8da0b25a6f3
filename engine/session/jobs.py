"""Running pair comparisons: inline, or shared between this process and a process pool.

With ``jobs > 1`` and enough work (:attr:`JobRunner.MIN_PARALLEL_COST` estimated seconds)
this process and ``jobs − 1`` others compare the pairs. Where fork is safe (:mod:`.forked`:
nothing pickled on the way in) the pairs are cut into units — a large pair each, small pairs a
batch of ``segments.BATCH`` elements — queued largest first (:class:`.forked.UnitQueue`), and
this process and its forked children each take the next unit when done with the last: a
process that gets less of a core (a busy box), or has more to do after the run (this one
stores the results and writes the report), takes fewer units instead of being waited for.
Elsewhere the pairs are cut into ``jobs`` shares of about equal estimated cost, this process
comparing the first while a process pool compares one share each (one task per worker keeps
its per-task cost, ~0.2 ms, out of the per-pair cost). Results travel back without their
records (the caller has them). Small pairs are measured a batch at a time
(``compare.compare_pairs``), which gives the same metrics as one at a time, so results never
depend on ``jobs`` or on which process took which unit.

A pool that cannot start (``ValueError: bad value(s) in fds_to_keep`` while a front end has
swapped ``sys.stderr``, no ``fork``/``sem_open`` on the platform...) is not an error: the work is
compared inline and :attr:`JobRunner.notes` says so once.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Any, TypeVar

from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.records import PairResult, TensorRecord, Verdict
from layerwatch.engine.session.forked import Forked, UnitQueue, can_fork

if TYPE_CHECKING:
    from concurrent.futures import Executor, Future


def _log() -> Any:
    """This module's logger; ``logging`` is imported only when something is logged (it and its
    imports cost ~3 ms of every compare's start-up)."""
    import logging

    return logging.getLogger(__name__)


PROGRESS_EVERY = 64
"""Inline pairs per progress report (without a progress callback: all in one call)."""
PAIR_COST = 100e-6
"""Estimated seconds per pair on the streaming path (files, calls, verdict)."""
SMALL_PAIR_COST = 50e-6
"""... and per pair measured in a batch of small pairs (two reads, a verdict)."""
BYTE_COST = 0.8e-9
"""... plus per byte of golden + target payload (≈ 4 ns per fp32/bf16 element pair). Checked
on the bench dumps: (a) 868 pairs, 490 MB → 0.45 s estimated, 0.47 s measured; (b) 904 small
pairs → 50 ms, 55 ms."""
FUSED_BYTE_COST = 0.4e-9
"""... per byte once the compiled kernel is loaded (``numerics/fused.py``; (a): 0.2 s)."""

UNIT_PAIRS = 256
"""Small pairs in one unit at most (~13 ms of work at :data:`SMALL_PAIR_COST`): tiny tensors
(16 elements) would otherwise make one unit of thousands of pairs, nothing to share."""

T = TypeVar("T")
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


def run_one(
    compare: CompareFn, thresholds: object, work: Work, side_stats: bool = False
) -> PairResult:
    """Compare one pair; a crash in the metric code becomes an ERROR verdict, never a traceback.
    ``side_stats`` is passed on only when set (``compare_pair`` knows it; other compares need not)."""
    extra = {"side_stats": True} if side_stats else {}
    try:
        return compare(work.golden, work.target, thresholds, is_logits=work.is_logits, **extra)
    except LayerwatchError as exc:
        message = str(exc)
    except Exception as exc:  # a bug or an unreadable payload: report it on the pair
        message = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return _error(work, message)


def run_many(
    compare: CompareFn, thresholds: object, works: list[Work], side_stats: bool = False
) -> list[PairResult]:
    """Several pairs, results in order; small pairs a batch at a time when ``compare`` is the
    engine's ``compare_pair`` (same results). A failure of the batch falls back to one by one."""
    from layerwatch.engine.numerics.compare import compare_pair, compare_pairs

    if compare is compare_pair and len(works) > 1:
        try:
            return compare_pairs(
                [(w.golden, w.target, w.is_logits) for w in works],
                thresholds,  # type: ignore[arg-type]
                side_stats=side_stats,
            )
        # what the batch path can raise beyond its own ERROR verdicts (reading, numpy, memory):
        # it must not cost the pairs, which are then compared one by one
        except (LayerwatchError, OSError, ValueError, ArithmeticError, MemoryError) as exc:
            _log().warning(
                "batch compare failed (%s: %s); comparing one by one", type(exc).__name__, exc
            )
    return [run_one(compare, thresholds, w, side_stats) for w in works]


def pool_task(
    compare: CompareFn, thresholds: object, works: list[Work], side_stats: bool = False
) -> list[PairResult]:
    """A worker's share: results without their records (the caller has them; saves pickling)."""
    results = run_many(compare, thresholds, works, side_stats)
    for result in results:
        result.golden = result.target = None
    return results


def take_units(
    compare: CompareFn,
    thresholds: object,
    work: Sequence[Work],
    units: list[list[int]],
    queue: UnitQueue,
    first: int,
    side_stats: bool = False,
) -> list[tuple[int, list[PairResult]]]:
    """A forked child's part of :meth:`JobRunner._run_forked`: unit ``first``, then units from
    ``queue`` until it is empty; each unit's results without their records."""
    return [
        (u, pool_task(compare, thresholds, [work[i] for i in units[u]], side_stats))
        for u in queue.take(first)
    ]


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
        golden_stats=base.golden_stats if work.golden.stats is None else None,
        target_stats=base.target_stats if work.target.stats is None else None,
    )


def _worker_failed(work: Work, exc: Exception) -> PairResult:
    """The ERROR result of a pair whose worker died before giving its results back."""
    return _error(work, f"compare worker failed: {type(exc).__name__}: {exc}".splitlines()[0])


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

    MIN_PARALLEL_COST = 0.15
    """Estimated seconds of comparing below which everything stays in this process. Another
    process costs ~20 ms however little it does: after a fork both processes copy every memory
    page they write (measured: case (b), 904 small pairs, 55 ms of comparing: half of it in
    each of two processes took 46 + 40 ms); a pool pickles records instead."""

    def __init__(self, compare: CompareFn, thresholds: object, jobs: int = 1) -> None:
        self.compare = compare
        self.thresholds = thresholds
        self.jobs = jobs if jobs > 0 else auto_jobs()
        self.notes: list[str] = []
        """One-line notes for the user (the pool could not start...); the caller drains them."""
        self.side_stats = False
        """Ask the compare function for side statistics (records without any; CSV reports)."""
        self.shares_elsewhere = 0
        """Shares compared in another process so far (forked children or pool tasks)."""
        self.meanwhile: Callable[[], None] | None = None
        """Called once in this process, when forked children have started and before it takes
        a unit: the windowed compare reads its next window there (``session/windowed.py``),
        while the children compare. Cleared by the call; never called on any other path."""
        self._pool: Executor | None = None
        self._pool_failed = False

    def stays_inline(self, golden: Sequence[TensorRecord], target: Sequence[TensorRecord]) -> bool:
        """Whether :meth:`run` would compare these records' pairs in this process alone (their
        estimated cost below :attr:`MIN_PARALLEL_COST`, each golden record taken as a pair),
        and counting their elements leaves the compiled kernel as it is (``fused.unchanged_by``):
        the windowed compare then compares such a window while forked children compare the
        one before (``session/windowed.py``), and this process's units of that window must
        meet the kernel state the children have."""
        from layerwatch.engine.numerics import fused
        from layerwatch.engine.numerics.segments import SMALL

        if self.jobs <= 1:
            return True
        sizes = [math.prod(r.shape) for r in golden if r.loc is not None]  # the pairs'
        if not fused.unchanged_by(sum(sizes)):
            return False
        small = sum(1 for n in sizes if 0 < n <= SMALL)
        nbytes = sum(_nbytes(r) for r in golden) + sum(_nbytes(r) for r in target)
        cost = _estimate(small, len(sizes) - small, nbytes)
        return cost < self.MIN_PARALLEL_COST

    @contextmanager
    def alone(self) -> Iterator[None]:
        """Everything run inside stays in this process (``jobs`` 1): a window compared while
        forked children, started from this process, compare the one before."""
        jobs, self.jobs = self.jobs, 1
        try:
            yield
        finally:
            self.jobs = jobs

    def plan(
        self, work: Sequence[Work], costs: Sequence[float] | None = None
    ) -> tuple[list[list[int]], list[int]]:
        """(pool tasks, indices compared inline): ``jobs`` shares of about equal estimated
        cost (largest pairs first, each onto the lightest share), the first one inline; or
        everything inline when there is too little work for the pool to pay. ``costs``: each
        pair's :func:`_cost` when the caller has them."""
        everything = list(range(len(work)))
        if self.jobs <= 1 or self._pool_failed:
            return [], everything
        if costs is None:
            costs = [_cost(w) for w in work]
        if sum(costs) < self.MIN_PARALLEL_COST:
            return [], everything
        shares: list[list[int]] = [[] for _ in range(self.jobs)]
        loads = [0.0] * self.jobs
        for i in sorted(everything, key=lambda i: -costs[i]):
            k = loads.index(min(loads))
            shares[k].append(i)
            loads[k] += costs[i]
        return [sorted(s) for s in shares[1:] if s], sorted(shares[0])

    def run(
        self, work: Sequence[Work], progress: Callable[[int, int], None] | None = None
    ) -> list[PairResult]:
        """Results in the order of ``work``."""
        _load_kernel(work)
        costs = None
        if self.jobs > 1 and self._pool is None and not self._pool_failed and can_fork():
            costs = [_cost(w) for w in work]
            if sum(costs) >= self.MIN_PARALLEL_COST:
                shared = self._run_forked(work, costs, progress)
                if shared is not None:
                    return shared
        tasks, inline = self.plan(work, costs)
        total = len(work)
        results: list[PairResult | None] = [None] * total
        futures: dict[Future[list[PairResult]], list[int]] = {}
        for task in tasks:
            share = [work[i] for i in task]
            future = self.submit(pool_task, self.compare, self.thresholds, share, self.side_stats)
            if future is None:  # no worker: this share is compared here too
                inline = sorted(inline + task)
            else:
                futures[future] = task
                self.shares_elsewhere += 1
        done = 0
        step = PROGRESS_EVERY if progress is not None else max(1, len(inline))
        for start in range(0, len(inline), step):
            part = inline[start : start + step]
            for i, result in zip(
                part,
                run_many(self.compare, self.thresholds, [work[i] for i in part], self.side_stats),
                strict=True,
            ):
                results[i] = result
            done += len(part)
            if progress is not None:
                progress(done, total)
        if futures:
            from concurrent.futures import as_completed

            for future in as_completed(futures):
                task = futures[future]
                try:
                    for i, result in zip(task, future.result(), strict=True):
                        result.golden, result.target = work[i].golden, work[i].target
                        results[i] = result
                except Exception as exc:  # a worker died (out of memory...): report it on the pairs
                    for i in task:
                        results[i] = _worker_failed(work[i], exc)
                done += len(task)
                if progress is not None:
                    progress(done, total)
        return [r for r in results if r is not None]

    @staticmethod
    def units(work: Sequence[Work], costs: Sequence[float]) -> list[list[int]]:
        """``work`` cut into units for :meth:`_run_forked`, largest estimated cost first: each
        large pair alone, small pairs (``segments.SMALL``) in their order, in batches of at most
        ``segments.BATCH`` elements (what ``compare_pairs`` measures in one go) and
        :data:`UNIT_PAIRS` pairs; at most ``UnitQueue.LIMIT`` units."""
        from layerwatch.engine.numerics.segments import BATCH

        units: list[tuple[float, list[int]]] = []
        batch: list[int] = []
        held = 0
        for i, w in enumerate(work):
            size = _small_elements(w)
            if not size:
                units.append((costs[i], [i]))
                continue
            if batch and (held + size > BATCH or len(batch) == UNIT_PAIRS):
                units.append((sum(costs[j] for j in batch), batch))
                batch, held = [], 0
            batch.append(i)
            held += size
        if batch:
            units.append((sum(costs[j] for j in batch), batch))
        units.sort(key=lambda u: -u[0])  # stable: equal costs keep their order
        if len(units) > UnitQueue.LIMIT:  # far more units than needed to balance: fewer, bigger
            per = -(-len(units) // UnitQueue.LIMIT)
            units = [
                (0.0, [i for _, unit in units[k : k + per] for i in unit])
                for k in range(0, len(units), per)
            ]
        return [unit for _, unit in units]

    def _run_forked(
        self,
        work: Sequence[Work],
        costs: Sequence[float],
        progress: Callable[[int, int], None] | None,
    ) -> list[PairResult] | None:
        """This process and ``jobs − 1`` forked children take units (:meth:`units`) from one
        queue until it is empty; ``None`` when no child could be forked (the caller goes on)."""
        units = self.units(work, costs)
        if len(units) < 2:
            return None
        forks = min(self.jobs, len(units)) - 1
        queue = UnitQueue(len(units), reserved=forks + 1)  # unit k: process k's first
        children: list[Forked[list[tuple[int, list[PairResult]]]]] = []
        unforked: list[int] = []  # reserved first units of children that could not be forked
        try:
            for k in range(1, forks + 1):
                try:
                    children.append(
                        Forked(
                            take_units,
                            self.compare,
                            self.thresholds,
                            work,
                            units,
                            queue,
                            k,
                            self.side_stats,
                        )
                    )
                except OSError:  # no fork (process limit...): its first unit is done here
                    unforked.append(k)
            if not children:
                return None
            self.shares_elsewhere += len(children)
            meanwhile, self.meanwhile = self.meanwhile, None
            if meanwhile is not None:
                meanwhile()
            total = len(work)
            results: list[PairResult | None] = [None] * total
            done = 0
            for u in chain(unforked, queue.take(0)):  # a unit at a time: children take the rest
                part = units[u]
                found = run_many(
                    self.compare, self.thresholds, [work[i] for i in part], self.side_stats
                )
                for i, result in zip(part, found, strict=True):
                    results[i] = result
                done += len(part)
                if progress is not None:
                    progress(done, total)
        finally:
            queue.close()
        died: Exception | None = None
        for child in children:
            try:
                for u, found in child.result():
                    for i, result in zip(units[u], found, strict=True):
                        result.golden, result.target = work[i].golden, work[i].target
                        results[i] = result
                    done += len(units[u])
            except Exception as exc:  # a child died (out of memory...): its units are errors
                died = died or exc
            if progress is not None:
                progress(done, total)
        if died is not None:  # the units no process gave back: the ones the dead child took
            for i, missing in enumerate(results):
                if missing is None:
                    results[i] = _worker_failed(work[i], died)
            if progress is not None:
                progress(total, total)
        return [r for r in results if r is not None]

    def submit(self, fn: Callable[..., T], *args: object) -> Future[T] | None:
        """``fn(*args)`` in a worker process, or ``None`` when no pool can start (then the
        caller runs it itself; a note says why, once)."""
        if self._pool_failed:
            return None
        try:
            return self.pool().submit(fn, *args)
        except Exception as exc:  # ValueError (fds_to_keep), OSError, BrokenProcessPool...
            self._pool_failed = True
            self.close()
            first = f"{type(exc).__name__}: {exc}".splitlines()[0]
            self.notes.append(f"no worker processes ({first}); compared in this process")
            return None

    def pool(self) -> Executor:
        """The worker processes (started on first use; also used to read dumps in parallel).

        ``jobs − 1`` workers: this process takes a share of every run itself."""
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # fork is cheapest but unsafe once other threads exist (the live pipeline has some).
            method = (
                "fork" if threading.active_count() == 1 and hasattr(os, "fork") else "forkserver"
            )
            self._pool = ProcessPoolExecutor(
                max(1, self.jobs - 1), mp_context=multiprocessing.get_context(method)
            )
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def auto_jobs() -> int:
    """Processes for ``--jobs 0``: this one plus one for each core the load average leaves idle
    (``capture/cpus.py``), at most the cores. A process on a core the box is using anyway only
    adds its fork and copied pages and is waited for at the end: bench case (a) on the 2-core box
    at load 2.1–2.7, two processes took 1.28× the wall of one (10 alternated pairs, median)."""
    from layerwatch.capture.cpus import cores, spare_cores

    return max(1, min(cores(), 1 + spare_cores()))


def _cost(work: Work) -> float:
    """Estimated seconds to compare one pair (for the decision and for balancing shares)."""
    small = 1 if _small_elements(work) else 0
    return _estimate(small, 1 - small, work.nbytes)


def _estimate(small: int, large: int, nbytes: int) -> float:
    """Estimated seconds to compare ``small`` + ``large`` pairs of ``nbytes`` payload (both
    sides): the one cost model of :func:`_cost` and :meth:`JobRunner.stays_inline`."""
    from layerwatch.engine.numerics import fused

    per_byte = FUSED_BYTE_COST if fused.loaded() else BYTE_COST
    return small * SMALL_PAIR_COST + large * PAIR_COST + per_byte * nbytes


def _small_elements(work: Work) -> int:
    """The elements of a pair that ``compare_pairs`` measures in a batch (a small pair,
    ``segments.SMALL``, not logits), else 0: one test for :func:`_cost` and
    :meth:`JobRunner.units`."""
    from layerwatch.engine.numerics.segments import SMALL

    size = math.prod(work.golden.shape) if work.golden.loc is not None else 0
    return size if 0 < size <= SMALL and not work.is_logits else 0


def _load_kernel(work: Sequence[Work]) -> None:
    """Count ``work``'s elements towards loading the compiled metric kernel
    (``fused.MIN_ELEMS``: a run's windows, a live session's batches add up), here and before
    any fork: forked children inherit it at no cost, and a pair meets the same kernel state
    whether it is compared here or in a child. The kernel's last digits differ from the numpy
    path's, so counting in the children (whose counts never come back) made a run's report
    depend on how many processes ``--jobs 0`` took at the box's load."""
    from layerwatch.engine.numerics import fused

    if fused.disabled() or fused.loaded():
        return
    elems = sum(math.prod(w.golden.shape) for w in work if w.golden.loc is not None)
    fused.kernel_for(elems, running=True)
