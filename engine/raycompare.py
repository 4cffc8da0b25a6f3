"""``layerwatch compare GOLDEN D --ray ADDRESS``: each rank compared on the node that holds it.

A tensor-parallel job over several machines leaves ``D/rank{r}/`` on the node that ran rank r
(hundreds of GiB each): the compare goes to the data, the data does not come to the driver.

* **Where the ranks are.** Nodes need no set-up (no custom resources at ``ray start``): one tiny
  probe task per alive node, pinned to it (``NodeAffinitySchedulingStrategy``, ``soft=False``),
  lists the ``D/rank{r}`` folders with a ``manifest.json`` that exist *there* and whether the
  golden path exists there too. A rank goes to a node holding both, spread round-robin over
  the holders so ranks visible everywhere (one machine, a shared file system) still spread.
* **The compare of one rank** is the local compare of ``GOLDEN`` vs ``D/rank{r}`` (the golden
  spread over the rank by engine/session/ranks.py, the world size from the rank's manifest) in
  a task pinned to that node. It returns the records it compared (metadata and locators, no
  tensor bytes) and the raw result of every pair it compared.
* **The local report.** Results come back rank by rank as the tasks finish (``ray.wait``); the
  driver feeds every rank's records to one :class:`~.session.core.CompareSession` whose compare
  function *looks the result up* (:class:`_Replay`): pairing, first failure, root cause, the
  JSON/CSV rows and the exit code are the local compare's code over the same results.

Limitation: the golden must be visible under the same path on every node that compares a rank
(a shared file system, or a copy); a node without it is not given a rank. Uneven shards (rank
sizes that do not add up equally) need every rank's shapes at once: a rank compared alone takes
equal shards (engine/session/ranks.py ``_start``), as ``compare GOLDEN D/rank1`` does.
"""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from layerwatch.capture.errors import LayerwatchError

if TYPE_CHECKING:
    from layerwatch.engine.records import PairResult, TensorKey, TensorRecord
    from layerwatch.engine.session.core import CompareSession

INSTALL_HINT = "compare --ray needs Ray: pip install 'layerwatch[ray]'"
CONNECT_TIMEOUT_S = 5.0

ResultKey = tuple["TensorKey", "TensorKey", bool]


@dataclass
class RankOutcome:
    """What one rank's task sends back: its records, raw results, notes and where it ran."""

    rank: int
    node_id: str
    golden: Any  # ReaderUpdate after the spread (records only; tensors stay on the node)
    target: Any
    results: dict[ResultKey, PairResult | str] = field(default_factory=dict)
    """Raw result per (golden key, target key, is_logits); a string: the pair's error line."""


class _Recording:
    """The engine's compare, keeping every raw result (or error line) it produced."""

    def __init__(self) -> None:
        from layerwatch.engine.numerics.compare import compare_pair

        self.compare: Callable[..., PairResult] = compare_pair
        self.results: dict[ResultKey, PairResult | str] = {}

    def __call__(
        self, golden: TensorRecord, target: TensorRecord, thresholds: object, **kw: Any
    ) -> PairResult:
        key = (golden.key, target.key, bool(kw.get("is_logits", False)))
        try:
            result = self.compare(golden, target, thresholds, **kw)
        except LayerwatchError as exc:
            self.results[key] = str(exc)
            raise
        except Exception as exc:  # engine/session/jobs.py run_one's wording
            self.results[key] = f"{type(exc).__name__}: {exc}".splitlines()[0]
            raise
        self.results[key] = result
        return result


class _Replay:
    """A compare function that returns the result a rank's task computed for the same pair."""

    def __init__(self) -> None:
        self.results: dict[ResultKey, PairResult | str] = {}

    def __call__(
        self, golden: TensorRecord, target: TensorRecord, thresholds: object, **kw: Any
    ) -> PairResult:
        got = self.results.get((golden.key, target.key, bool(kw.get("is_logits", False))))
        if got is None:
            raise LayerwatchError("not compared on its rank's node")
        if isinstance(got, str):
            raise LayerwatchError(got)
        return replace(got, golden=golden, target=target)


def compare_rank(settings: dict[str, Any], golden: str, rank_dir: str, rank: int) -> RankOutcome:
    """The compare of ``golden`` vs one rank folder, on the node that runs it (a Ray task body)."""
    from layerwatch.engine.numerics.blas import env_before_numpy

    env_before_numpy()
    from layerwatch.engine.readers import open_dump
    from layerwatch.engine.session import ranks

    updates = {
        "golden": open_dump(golden, side="golden").poll(None, final=True),
        "target": open_dump(rank_dir, side="target").poll(None, final=True),
    }
    nodes = settings.get("nodes")
    if nodes:  # --nodes GLOB, as engine/runner.py applies it
        for u in updates.values():
            u.only_nodes(nodes)
    ranks.spread_updates(
        updates["golden"], updates["target"], ranks.world_size(rank_dir), settings.get("map")
    )
    recording = _Recording()
    session = _session(settings, recording)
    try:
        session.compare_finished(updates["golden"], updates["target"])
    finally:
        session.close()
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    return RankOutcome(rank, node_id, updates["golden"], updates["target"], recording.results)


def _session(settings: dict[str, Any], compare: Callable[..., PairResult]) -> CompareSession:
    from layerwatch.capture.tokens import parse_tokens
    from layerwatch.engine.session.core import CompareSession

    tokens = settings.get("tokens")
    return CompareSession(
        thresholds=settings.get("thresholds"),
        mapping=settings.get("map"),
        tokens=parse_tokens(tokens) if tokens else None,
        jobs=1,
        auto_map=True if settings.get("auto_map") else None,
        compare=compare,
        side_stats=bool(settings.get("output")),
    )


def probe_node(target: str, golden: str) -> tuple[str, dict[int, int | None], bool]:
    """(this node's id, {rank: world size} of the rank folders under ``target`` here, golden
    visible here) — the task each node runs so the driver knows where the data lives."""
    import ray
    from layerwatch.engine.session.ranks import world_size

    root = Path(target)
    held: dict[int, int | None] = {}
    if root.is_dir():
        for sub in root.iterdir():
            name = sub.name
            if name.startswith("rank") and name[4:].isdigit() and (sub / "manifest.json").is_file():
                held[int(name[4:])] = world_size(sub)
    return ray.get_runtime_context().get_node_id(), held, Path(golden).exists()


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise LayerwatchError(INSTALL_HINT) from None
    return ray


def _reachable(address: str) -> None:
    """Fail in seconds, with one line, on an address nothing listens at (``ray.init`` would
    retry for a minute). ``auto``/``local`` are Ray's own lookups: left to it."""
    if address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise LayerwatchError(f"--ray {address}: expected HOST:PORT (or ray://HOST:PORT, auto)")
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise LayerwatchError(
            f"--ray {address}: cannot reach a Ray cluster there ({exc})"
        ) from None


def plan(
    probes: list[tuple[str, dict[int, int | None], bool]],
) -> tuple[dict[int, str], int | None]:
    """({rank: node id to run it}, world size): each rank on a node holding it and the golden,
    ranks spread round-robin over their holders."""
    holders: dict[int, list[str]] = {}
    world: int | None = None
    for node_id, held, has_golden in probes:
        for rank, size in held.items():
            world = max(world or 0, size or 0) or world
            if has_golden:
                holders.setdefault(rank, []).append(node_id)
    load: dict[str, int] = {}
    chosen: dict[int, str] = {}
    for rank in sorted(holders):
        node = min(holders[rank], key=lambda n: (load.get(n, 0), holders[rank].index(n)))
        load[node] = load.get(node, 0) + 1
        chosen[rank] = node
    return chosen, world


def run_ranks(
    address: str, golden: str, target: str, settings: dict[str, Any]
) -> tuple[list[RankOutcome], list[str], int | None]:
    """Every rank's outcome (in the order they finished), notes, world size."""
    ray = _import_ray()
    _reachable(address)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    started = not ray.is_initialized()
    if started:
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        except Exception as exc:
            raise LayerwatchError(f"--ray {address}: {str(exc).splitlines()[0]}") from None
    try:
        golden_abs, target_abs = str(Path(golden).absolute()), str(Path(target).absolute())
        probe = ray.remote(num_cpus=0)(probe_node)
        nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
        probes = ray.get(
            [
                probe.options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)
                ).remote(target_abs, golden_abs)
                for n in nodes
            ]
        )
        chosen, world = plan(probes)
        notes = []
        if not any(held for _, held, _ in probes):
            raise LayerwatchError(f"target dump {target}: no node of the Ray cluster holds a rank")
        if not chosen:
            raise LayerwatchError(
                f"golden dump {golden}: not found on any Ray node that holds a rank of {target}"
                " (it must be at the same path there)"
            )
        orphans = sorted({r for _, held, _ in probes for r in held} - set(chosen))
        for r in orphans:
            notes.append(f"rank {r}: no node holding it sees the golden {golden}; not compared")
        for r in sorted(set(range(world or 0)) - {r for _, held, _ in probes for r in held}):
            notes.append(f"rank {r} of {world} has no tensors in {target}")
        task = ray.remote(num_cpus=1, max_retries=0)(compare_rank)
        pending = [
            task.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
            ).remote(settings, golden_abs, str(Path(target_abs) / f"rank{rank}"), rank)
            for rank, node in sorted(chosen.items())
        ]
        outcomes: list[RankOutcome] = []
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                outcomes.append(ray.get(done[0]))
                if sys.stderr.isatty():  # progress as each rank's rows arrive
                    got = outcomes[-1]
                    sys.stderr.write(
                        f"layerwatch compare: rank {got.rank} done on node {got.node_id[:12]}"
                        f" ({len(outcomes)}/{len(chosen)})\n"
                    )
            except ray.exceptions.RayTaskError as exc:
                cause = exc.cause if isinstance(exc.cause, LayerwatchError) else None
                if cause is not None:
                    raise LayerwatchError(str(cause)) from None
                raise LayerwatchError(
                    f"a rank's compare failed on its node: {str(exc).splitlines()[0]}"
                ) from None
        return outcomes, notes, world
    finally:
        if started:
            ray.shutdown()


def ray_compare_main(args: argparse.Namespace) -> int:
    """``compare --ray``: rows from every rank's node, one local report (engine/runner.py's)."""
    from layerwatch.engine.outcome import check_report_path, conclude_compare
    from layerwatch.engine.readers.base import ReaderUpdate

    if getattr(args, "fake_quant", None):
        raise LayerwatchError("--ray and --fake-quant cannot be combined")
    output = getattr(args, "output", None)
    check_report_path(output, pairs=True)
    settings: dict[str, Any] = {
        "thresholds": getattr(args, "thresholds", None),
        "map": getattr(args, "map", None),
        "tokens": getattr(args, "tokens", None),
        "auto_map": bool(getattr(args, "auto_map", False)),
        "output": output,
        "nodes": getattr(args, "nodes", None),
    }
    for key in ("thresholds", "map"):  # files the driver was given: the same path on the nodes
        if settings[key]:
            settings[key] = str(Path(settings[key]).absolute())
    outcomes, notes, _world = run_ranks(args.ray, args.golden, args.target, settings)
    replay = _Replay()
    merged = {"golden": ReaderUpdate(), "target": ReaderUpdate()}
    for outcome in sorted(outcomes, key=lambda o: o.rank):
        replay.results.update(outcome.results)
        for side in ("golden", "target"):
            update = getattr(outcome, side)
            if side == "golden" and outcome is not min(outcomes, key=lambda o: o.rank):
                update.notes = []  # the golden's own notes once, not once per rank
            merged[side].extend(update)
    merged["target"].notes.extend(notes)
    merged["target"].notes = list(dict.fromkeys(merged["target"].notes))
    session = _session(settings, replay)
    try:
        session.compare_finished(merged["golden"], merged["target"])
    finally:
        session.close()
    empty = f"no tensors in {args.golden} and {args.target}"
    return conclude_compare(args, session, empty)
