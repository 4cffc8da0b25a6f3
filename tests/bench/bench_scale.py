"""Memory and speed of ``layerwatch compare`` as the number of pairs grows (issue: scale).

    . .venv/bin/activate && python tests/bench/bench_scale.py [--pairs 100000 1000000] [--big]

Writes synthetic layerwatch dumps (golden, and a target perturbed by ~1e-7 relative: about an
fp32 rounding, so the pairs pass with real metric values) of N tokens × M tensors with 16-element float32 tensors, through capture's own
format code (``capture/format.py`` index lines, ``capture/safetensors_file.py`` batch files,
one per token), cached under ``--work`` (default ``/tmp/layerwatch-bench-scale``). Then it runs
``layerwatch compare GOLDEN TARGET -o report.csv`` in a fresh process per size and prints
pairs/s, that process's peak RSS (``wait4``), and bytes a pair of RAM above start-up (peak RSS
minus the peak of the same command on a one-token dump, over the pairs). ``--big`` adds 4 M
pairs. ``--open`` also times opening the index alone (``open_dump(...).poll``). ``--spill``
(with ``--session-only``) runs each size with the live session's store in RAM, then spilled
(``LAYERWATCH_SPILL=never|auto``, engine/session/budget.py ``live_spill``); ``compare`` keeps
no store (engine/session/windowed.py); ``--byte-chunks`` also runs each compare the way it read windows before the column index.

    python tests/bench/bench_scale.py --open-only 1000000 10000000 [--stats]

times opening golden dumps alone, in fresh processes: ``open_columns`` (what ``compare`` does)
against one ``poll`` that builds a record a tensor (up to ``--records-max``), with peak RSS.
CI runs :func:`measure` at ~100 k pairs (tests/engine/session/test_scale.py) and asserts
bytes a pair only — seconds are too noisy on shared runners.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

LAYER_OPS = (
    ("input_layernorm", "LlamaRMSNorm"),
    ("self_attn.q_proj", "Linear"),
    ("self_attn.k_proj", "Linear"),
    ("self_attn.v_proj", "Linear"),
    ("self_attn.o_proj", "Linear"),
    ("post_attention_layernorm", "LlamaRMSNorm"),
    ("mlp.gate_proj", "Linear"),
    ("mlp.up_proj", "Linear"),
    ("mlp.down_proj", "Linear"),
)
"""Leaf operators of one decoder layer; each dumps ``input_0`` and ``output`` (18 tensors)."""
ELEMENTS = 16
FORMATS = ("layerwatch", "msit", "atb", "msprobe")


PER_LAYER = [len(LAYER_OPS)]
"""Leaf operators a layer (``--ops-per-layer``): fewer gives as many grid columns (layers) with
fewer pairs a token — the goal session's grid of 32 768 tokens × 112 layers for real, at a
fraction of its 65 M pairs and of their disk."""


def nodes_for(tensors: int) -> list[tuple[str, str]]:
    """Leaf nodes (name, type) giving about ``tensors`` tensors a token (two per node)."""
    ops = LAYER_OPS[: PER_LAYER[0]]
    layers = max(1, -(-tensors // (2 * len(ops))))
    out = [(f"root.model.layers.{i}.{op}", kind) for i in range(layers) for op, kind in ops]
    return out[: max(1, tensors // 2)]


def token_values(
    golden: np.random.Generator,
    perturb: np.random.Generator,
    nodes: int,
    token: int,
    noise: float,
    faults: tuple[tuple[int, int], ...],
    exact: int = 0,
) -> np.ndarray:
    """One token's (node, input/output, element) values: ``golden``'s draw, the same on both
    sides, times this side's own noise (``perturb``; not on the first ``exact`` nodes), and
    each fault's output 10 % off from its token on. Every writer below draws the same way."""
    values = golden.standard_normal((nodes, 2, ELEMENTS), dtype=np.float32)
    if noise:
        noisy = values[exact:]
        noisy *= 1 + noise * perturb.standard_normal(noisy.shape, dtype=np.float32)
    for at, node in faults:
        if token >= at:
            values[node, 1] *= 1.1
    return values


def write_dump(
    rank_dir: Path,
    tokens: int,
    tensors: int,
    *,
    noise: float,
    seed: int,
    faults: tuple[tuple[int, int], ...] = (),
    diverge_at: int | None = None,
    stats: bool = False,
) -> int:
    """One rank directory of ``tokens`` × ~``tensors`` tensors; returns the tensors written.

    ``faults``: (token, node index) whose output is 10 % off from then on (a fault the session
    must find); ``diverge_at``: this side was fed other input ids from that token on;
    ``stats``: each tensor line carries its statistics, as a capture's do by default."""
    import torch
    from layerwatch.capture import format as lwf
    from layerwatch.capture.safetensors_file import write_batch_file

    nodes = nodes_for(tensors)
    (rank_dir / lwf.DATA_DIR).mkdir(parents=True, exist_ok=True)
    topo_nodes = [{"name": "root", "type": "LlamaForCausalLM", "parent": None, "order": -1}]
    for layer in sorted({n.split(".")[3] for n, _ in nodes}, key=int):
        topo_nodes.append(
            {"name": f"root.model.layers.{layer}", "type": "LlamaDecoderLayer", "parent": "root"}
        )
    for order, (name, kind) in enumerate(nodes):
        parent = ".".join(name.split(".")[:4])
        topo_nodes.append({"name": name, "type": kind, "parent": parent, "order": order})
    lwf.write_json_atomic(
        rank_dir / lwf.TOPOLOGY,
        {"format": "layerwatch-topology", "version": 1, "root": "root", "nodes": topo_nodes},
    )
    lwf.write_json_atomic(
        rank_dir / lwf.MANIFEST,
        {"format": lwf.FORMAT_NAME, "version": lwf.FORMAT_VERSION, "status": "complete"},
    )
    golden = np.random.default_rng(1234)  # the same values on both sides …
    perturb = np.random.default_rng(seed)  # … plus this side's own noise
    count = 0
    with open(rank_dir / lwf.INDEX, "w", encoding="utf-8") as index:
        for token in range(tokens):
            values = token_values(golden, perturb, len(nodes), token, noise, faults)
            file = lwf.data_file_name(token)
            entries = [
                (lwf.tensor_name(token, name, stem), torch.float32, [ELEMENTS], values[i, j])
                for i, (name, _) in enumerate(nodes)
                for j, stem in enumerate(("input_0", "output"))
            ]
            begin = write_batch_file(rank_dir / file, entries)
            ids = [token + (1000 if diverge_at is not None and token >= diverge_at else 0)]
            lines = [lwf.encode_line({"k": lwf.K_TOKEN, "token": token, "input_ids": ids})]
            size = ELEMENTS * 4
            for i, (name, kind) in enumerate(nodes):
                for j, stem in enumerate(("input_0", "output")):
                    at = begin + (2 * i + j) * size
                    entry = lwf.IndexTensor(
                        token,
                        name,
                        stem,
                        "float32",
                        (ELEMENTS,),
                        file,
                        at,
                        at + size,
                        i,
                        kind,
                        _stats(values[i, j]) if stats else None,
                    )
                    lines.append(lwf.encode_line(entry.to_json()))
            index.write("".join(lines))
            count += len(lines) - 1
        index.write(lwf.encode_line({"k": lwf.K_END, "status": "complete", "tokens": tokens}))
    return count


def write_index_only(rank_dir: Path, tokens: int, tensors: int) -> int:
    """An index alone (no data files) of ``tokens`` × ~``tensors`` tensor lines with
    statistics, formatted by the capture writer's own functions (``capture/index_lines.py``:
    its key order, not ``IndexTensor.to_json``'s), plus topology and manifest: what opening
    reads, written fast enough for 10 M lines on a machine without torch."""
    from layerwatch.capture import format as lwf
    from layerwatch.capture.index_lines import head_text, stats_text

    nodes = nodes_for(tensors)
    rank_dir.mkdir(parents=True, exist_ok=True)
    topo = [{"name": "root", "type": "LlamaForCausalLM", "parent": None, "order": -1}]
    topo += [{"name": n, "type": k, "parent": "root", "order": i} for i, (n, k) in enumerate(nodes)]
    lwf.write_json_atomic(
        rank_dir / lwf.TOPOLOGY,
        {"format": "layerwatch-topology", "version": 1, "root": "root", "nodes": topo},
    )
    lwf.write_json_atomic(
        rank_dir / lwf.MANIFEST,
        {"format": lwf.FORMAT_NAME, "version": lwf.FORMAT_VERSION, "status": "complete"},
    )
    heads = [head_text(n, stem, k) for n, k in nodes for stem in ("input_0", "output")]
    orders = [i for i in range(len(nodes)) for _ in range(2)]
    rng = np.random.default_rng(1234)
    size = ELEMENTS * 4
    with open(rank_dir / lwf.INDEX, "w", encoding="utf-8") as index:
        for token in range(tokens):
            v = rng.standard_normal((len(heads), ELEMENTS)).astype(np.float64)
            cols = zip(
                v.max(1).tolist(),
                v.min(1).tolist(),
                v.mean(1).tolist(),
                np.sqrt((v * v).sum(1)).tolist(),
                strict=True,
            )
            file = lwf.data_file_name(token)
            lines = [lwf.encode_line({"k": lwf.K_TOKEN, "token": token, "input_ids": [token]})]
            for i, (head, order, (mx, mn, mean, norm)) in enumerate(
                zip(heads, orders, cols, strict=True)
            ):
                begin = 8 + i * size
                lines.append(
                    f'{{"k":"t","token":{token},{head},"order":{order},"dtype":"float32",'
                    f'"shape":[{ELEMENTS}],"file":"{file}","begin":{begin},"end":{begin + size},'
                    f'"stats":{stats_text((mx, mn, mean, norm, 0, 0))}}}\n'
                )
            index.write("".join(lines))
        index.write(lwf.encode_line({"k": lwf.K_END, "status": "complete", "tokens": tokens}))
    return tokens * len(heads)


def _stats(values: np.ndarray) -> dict[str, float]:
    v = values.astype(np.float64)
    return {
        "max": float(v.max()),
        "min": float(v.min()),
        "mean": float(v.mean()),
        "norm": float(np.sqrt((v * v).sum())),
        "nan": 0,
        "inf": 0,
    }


def write_msit_dump(
    rank_dir: Path,
    tokens: int,
    tensors: int,
    *,
    noise: float,
    seed: int,
    faults: tuple[tuple[int, int], ...] = (),
    diverge_at: int | None = None,
    link: bool = False,
) -> int:
    """One msit rank directory (``{token}/{node}/{stem}.pth`` written by ``torch.save``,
    ``model_tree.json``, as ``capture/msit_writer.py`` lays it out) of ``tokens`` × ~``tensors``
    tensors; returns the tensors written. The first node is the embedding, whose ``input_0``
    holds the token's input id (msit's readers take the ids from it).

    ``faults``/``diverge_at``: as :func:`write_dump`. ``link``: every token after the first
    hard-links the first token's files (same values, far faster to write at a million pairs;
    each token still has its own directories and paths, as msit writes them)."""
    import torch

    nodes = [("root.model.embed_tokens", "Embedding"), *nodes_for(tensors - 2)]
    layers: dict[str, list[dict[str, object]]] = {}
    for name, kind in nodes[1:]:
        layers.setdefault(".".join(name.split(".")[:4]), []).append(
            {"name": name, "type": kind, "children": []}
        )
    model = [{"name": nodes[0][0], "type": "Embedding", "children": []}]
    model.append(
        {
            "name": "root.model.layers",
            "type": "ModuleList",
            "children": [
                {"name": layer, "type": "LlamaDecoderLayer", "children": ops}
                for layer, ops in layers.items()
            ],
        }
    )
    rank_dir.mkdir(parents=True, exist_ok=True)
    tree = {
        "name": "root",
        "type": "LlamaForCausalLM",
        "children": [{"name": "root.model", "type": "LlamaModel", "children": model}],
    }
    (rank_dir / "model_tree.json").write_text(json.dumps(tree))
    golden = np.random.default_rng(1234)
    perturb = np.random.default_rng(seed)
    count = 0
    for token in range(tokens):
        # not the embedding's noise: a gather adds no rounding (its local verdict says so)
        values = token_values(golden, perturb, len(nodes), token, noise, faults, exact=1)
        ids = token + (1000 if diverge_at is not None and token >= diverge_at else 0)
        for i, (name, _) in enumerate(nodes):  # execution order: file times follow it
            folder = rank_dir / str(token) / name
            folder.mkdir(parents=True)
            for j, stem in enumerate(("input_0", "output")):
                path = folder / f"{stem}.pth"
                if link and token:
                    os.link(rank_dir / "0" / name / path.name, path)
                elif i == 0 and j == 0:
                    torch.save(torch.tensor([[ids]], dtype=torch.int64), path)
                else:
                    torch.save(torch.from_numpy(values[i, j].copy()), path)
                count += 1
    return count


def link_token(rank_dir: Path, token: int) -> None:
    """Token ``token`` as hard links to token 0's files (its own directories and paths)."""
    first = rank_dir / "0"
    for folder, _dirs, files in os.walk(first):
        into = rank_dir / str(token) / Path(folder).relative_to(first)
        into.mkdir(parents=True, exist_ok=True)
        for name in files:
            os.link(Path(folder) / name, into / name)


def write_atb_dump(
    dump_dir: Path,
    tokens: int,
    tensors: int,
    *,
    noise: float,
    seed: int,
    faults: tuple[tuple[int, int], ...] = (),
    link: bool = False,
) -> int:
    """An ATB dump (``tensors/{device}_{pid}/{executeCount}/{order}_{Op}/…/{before|after}/``
    ``.bin`` files and the model json, written by tests/support/atb.py as the CANN probe lays
    them out) of ``tokens`` × ~``tensors`` tensors: one ``Decoder`` op a layer holding its
    operators, each with one input and one output. ``link``: tokens after the first hard-link
    its files. Returns the tensors written."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from support.atb import Op
    from support.atb import write_dump as write_atb

    nodes = nodes_for(tensors)
    golden = np.random.default_rng(1234)
    perturb = np.random.default_rng(seed)
    per_token = []
    for token in range(1 if link else tokens):
        values = token_values(golden, perturb, len(nodes), token, noise, faults)
        layers: dict[str, list[Op]] = {}
        for i, (name, kind) in enumerate(nodes):
            op = Op(f"{kind}Operation", inputs=[values[i, 0]], outputs=[values[i, 1]])
            layers.setdefault(name.split(".")[3], []).append(op)
        per_token.append([Op("Decoder", children=ops) for ops in layers.values()])
    write_atb(dump_dir, per_token)
    rank_dir = dump_dir / "tensors" / "0_4242"
    for token in range(1, tokens if link else 0):
        link_token(rank_dir, token)
    return 2 * len(nodes) * tokens


def write_msprobe_dump(
    step_dir: Path,
    tokens: int,
    tensors: int,
    *,
    noise: float,
    seed: int,
    faults: tuple[tuple[int, int], ...] = (),
) -> int:
    """An msprobe statistics dump (``proc0/dump.json`` + ``construct.json``, task
    ``statistics``, level ``L0``) of ``tokens`` forwards × ~``tensors`` tensors: every operator
    a module inside the top-level ``model`` module, whose repeat closes a token (how
    engine/readers/msprobe.py rebuilds tokens). msprobe writes one file a step, so it is read
    whole. Returns the tensors written."""
    nodes = nodes_for(tensors)
    golden = np.random.default_rng(1234)
    perturb = np.random.default_rng(seed)
    data: dict[str, object] = {}
    construct: dict[str, str | None] = {}

    def stats(v: np.ndarray) -> dict[str, object]:
        return {
            "type": "torch.Tensor", "dtype": "torch.float32", "shape": [ELEMENTS],
            "Max": float(v.max()), "Min": float(v.min()), "Mean": float(v.mean()),
            "Norm": float(np.linalg.norm(v)), "requires_grad": False,
        }  # fmt: skip

    for token in range(tokens):
        values = token_values(golden, perturb, len(nodes), token, noise, faults)
        top = f"Module.model.LlamaModel.forward.{token}"
        for i, (name, kind) in enumerate(nodes):
            entry = f"Module.{name.removeprefix('root.')}.{kind}.forward.{token}"
            data[entry] = {"input_args": [stats(values[i, 0])], "output": [stats(values[i, 1])]}
            construct[entry] = top
        data[top] = {"input_args": [], "output": []}
        construct[top] = None
    rank_dir = step_dir / "step0" / "proc0"
    rank_dir.mkdir(parents=True, exist_ok=True)
    head = {"task": "statistics", "level": "L0", "framework": "pytorch", "dump_data_dir": None}
    (rank_dir / "dump.json").write_text(json.dumps({**head, "data": data}))
    (rank_dir / "construct.json").write_text(json.dumps(construct))
    return 2 * len(nodes) * tokens


def make_pair(
    work: Path, tokens: int, tensors: int, noise: float = 1e-7, fmt: str = "layerwatch"
) -> tuple[Path, Path, int]:
    """Golden and target dumps (cached by size and format); returns their paths and the pair
    count. ``fmt``: ``layerwatch`` or ``msit`` (its per-token directories)."""
    ops = "" if PER_LAYER[0] == len(LAYER_OPS) else f"o{PER_LAYER[0]}"
    base = work / f"{'' if fmt == 'layerwatch' else fmt + '-'}t{tokens}x{tensors}{ops}n{noise:g}"
    done = base / "pairs"
    if done.is_file():
        return base / "golden", base / "target", int(done.read_text())
    shutil.rmtree(base, ignore_errors=True)
    if fmt == "msit":
        n = write_msit_dump(
            base / "golden" / "cpu_1", tokens, tensors, noise=0.0, seed=1, link=True
        )
        write_msit_dump(base / "target" / "cpu_2", tokens, tensors, noise=noise, seed=2, link=True)
    elif fmt == "atb":
        n = write_atb_dump(base / "golden", tokens, tensors, noise=0.0, seed=1, link=True)
        write_atb_dump(base / "target", tokens, tensors, noise=noise, seed=2, link=True)
    elif fmt == "msprobe":
        n = write_msprobe_dump(base / "golden", tokens, tensors, noise=0.0, seed=1)
        write_msprobe_dump(base / "target", tokens, tensors, noise=noise, seed=2)
    else:
        n = write_dump(base / "golden" / "cpu_1", tokens, tensors, noise=0.0, seed=1)
        write_dump(base / "target" / "cpu_2", tokens, tensors, noise=noise, seed=2)
    done.write_text(str(n))
    return base / "golden", base / "target", n


@dataclass
class Figures:
    pairs: int
    seconds: float
    peak_rss: int
    """Bytes."""
    rc: int

    @property
    def pairs_per_s(self) -> float:
        return self.pairs / self.seconds if self.seconds else 0.0


_WRAPPER = """
import os, sys
from layerwatch.tui.cli import main
if os.environ.get("BENCH_BYTE_CHUNKS"):  # as before the column index: a record a line as read
    from layerwatch.capture import format as lwf
    from layerwatch.engine.readers.layerwatch import IndexScan, LayerwatchReader

    def count_lines(self):  # the index counted by its bytes, as scan_index did
        scan = IndexScan()
        for state in self._discover():
            with open(state.path / lwf.INDEX, "rb") as fh:
                rest = b""
                while chunk := fh.read(4 << 20):
                    chunk = rest + chunk
                    cut = chunk.rfind(b"\\n") + 1
                    chunk, rest = chunk[:cut], chunk[cut:]
                    scan.add(chunk)
                scan.add(rest)
        return scan

    LayerwatchReader.scan_index = count_lines
    del LayerwatchReader.open_columns
try:
    rc = main(sys.argv[1:])
finally:
    with open("/proc/self/status") as fh:
        hwm = next(line for line in fh if line.startswith("VmHWM"))
    sys.stderr.write("\\n@@" + hwm.split()[1] + "\\n")
sys.exit(rc)
"""
"""Runs the CLI and prints its own peak RSS (``VmHWM``, kB): a child's ``ru_maxrss`` would count
the bench's own pages from before ``exec``."""

_WHOLE = """
import sys
from layerwatch.engine.numerics.blas import env_before_numpy
env_before_numpy()
from layerwatch.engine.outcome import write_report
from layerwatch.engine.readers import open_dump
from layerwatch.engine.session.core import CompareSession
golden, target, report = sys.argv[1:4]
session = CompareSession(jobs=0, side_stats=True)
try:
    session.compare_finished(
        open_dump(golden, side="golden").poll(None, final=True),
        open_dump(target, side="target").poll(None, final=True),
    )
finally:
    session.close()
write_report(report, session)
with open("/proc/self/status") as fh:
    hwm = next(line for line in fh if line.startswith("VmHWM"))
sys.stderr.write("\\n@@" + hwm.split()[1] + "\\n")
"""
"""The whole-run compare every format but layerwatch took before windows (one session holding
every record and result, the report written at the end): the "before" of ``--before``."""


def run_compare(
    golden: Path,
    target: Path,
    report: Path,
    *extra: str,
    spill: str = "auto",
    byte_chunks: bool = False,
    whole: bool = False,
    command: str = "compare",
) -> Figures:
    """``layerwatch compare`` (or ``open --headless``: the live session) in a fresh process
    (``whole``: the whole-run session instead); its own peak RSS. ``byte_chunks``: windows read
    the way they were before the column index (for same-run ratios)."""
    if whole:
        cmd = [sys.executable, "-c", _WHOLE, str(golden), str(target), str(report)]
    else:
        cmd = [sys.executable, "-c", _WRAPPER, command, str(golden), str(target)]
        if command == "open":
            extra = ("--headless", "--jobs", "1", *extra)
        cmd += ["-o", str(report), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LAYERWATCH_SPILL": spill}
    if byte_chunks:
        env["BENCH_BYTE_CHUNKS"] = "1"
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seconds = time.perf_counter() - start
    err = proc.stderr.decode()
    if proc.returncode not in (0, 1) or "@@" not in err:
        raise RuntimeError(f"compare exited {proc.returncode}: {err.strip()[-2000:]}")
    hwm = err.rpartition("@@")[2]
    return Figures(0, seconds, int(hwm.split()[0]) * 1024, proc.returncode)


def measure(
    work: Path,
    pairs: int,
    tensors: int = 2000,
    suffix: str = ".csv",
    spill: str = "auto",
    byte_chunks: bool = False,
    fmt: str = "layerwatch",
    whole: bool = False,
    command: str = "compare",
) -> dict[str, float]:
    """Pairs/s, peak RSS and bytes a pair above start-up for about ``pairs`` pairs of ``fmt``
    dumps (``spill``: the store in RAM ``never``, on disk ``always``, or as the budget decides;
    ``whole``: the whole-run session, the path before windows; ``command``: ``compare``, or
    ``open`` for the live session behind ``open``/``watch``/``run``)."""
    tensors = min(tensors, pairs)
    tokens = max(1, round(pairs / (2 * len(nodes_for(tensors)))))
    how = {"spill": spill, "byte_chunks": byte_chunks, "whole": whole, "command": command}
    g0, t0, _ = make_pair(work, 1, tensors, fmt=fmt)
    base = run_compare(g0, t0, work / f"base{suffix}", **how)
    golden, target, n = make_pair(work, tokens, tensors, fmt=fmt)
    fig = run_compare(golden, target, work / f"report{suffix}", **how)
    return {
        "pairs": n,
        "seconds": fig.seconds,
        "pairs_per_s": n / fig.seconds,
        "peak_rss_mb": fig.peak_rss / 2**20,
        "start_rss_mb": base.peak_rss / 2**20,
        "bytes_per_pair": max(0, fig.peak_rss - base.peak_rss) / n,
    }


def time_open(golden: Path) -> tuple[int, float]:
    from layerwatch.engine.readers import open_dump

    start = time.perf_counter()
    update = open_dump(str(golden), side="golden").poll(None, final=True)
    return len(update.tensors), time.perf_counter() - start


COLD_REPAINTS = 60
"""Cold repaints a run once loaded: with 20 the p95 was the largest one."""


def tui_child(golden: Path, target: Path, seconds: float, colds: int = COLD_REPAINTS) -> None:
    """In a fresh process: the TUI (headless ``run_test``, 200×50) over ``open`` of the two
    dumps — the live session, settling tokens as it reads them. Prints one ``@@TUI`` line of
    JSON: load time, frame and key→frame figures while loading and once loaded, ``colds``
    cold repaints (wall, UI-thread CPU, the collector's share), RSS."""
    import asyncio
    import gc
    import json

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_tui import Probe, cold_repaint, key_latencies, loading_key_latencies, rss_mb
    from layerwatch.engine.live.pipeline import LivePipeline, attach_spec
    from layerwatch.engine.session.budget import live_spill
    from layerwatch.engine.session.core import CompareSession
    from layerwatch.tui.app import LayerwatchApp

    async def run() -> dict[str, object]:
        # the session `open` makes (tui/frontends.py `_session`): settled chunks spilled
        session = CompareSession(jobs=1, compact=True, spill=live_spill(None))
        source = LivePipeline(
            attach_spec(golden, idle_s=0, watch=False),
            attach_spec(target, idle_s=0, watch=False),
            session=session,
        )
        source.freeze_heap = True  # as tui/app.py run_app sets them for `open`
        source.share_gil = True
        app = LayerwatchApp(source, title="bench-scale", color_system="truecolor")
        start_rss = rss_mb()[0]
        t0, c0 = time.perf_counter(), time.process_time()
        async with app.run_test(size=(200, 50)) as pilot:
            await pilot.pause(0.3)
            probe = Probe(app)
            # keys while the session reads and compares, every one moving the cursor
            loading_keys, loading_lost = await loading_key_latencies(app, probe, source.done)
            loading_frames = list(probe.frames)
            loaded_s = time.perf_counter() - t0
            load_cpu_s = time.process_time() - c0
            load_avg = os.getloadavg()[0]
            await pilot.pause(1.0)  # the last batches drained into the grid
            cold_cpu: list[float] = []
            collecting: list[float] = []

            def timed_gc(phase: str, info: dict[str, int]) -> None:
                collecting.append(time.thread_time() * (1 if phase == "stop" else -1))

            gc.callbacks.append(timed_gc)
            cold_walls = [cold_repaint(app, cold_cpu) for _ in range(colds)]
            gc.callbacks.remove(timed_gc)
            probe.frames.clear()
            keys = await key_latencies(app, probe, 30, near_tail=False)
            frames = list(probe.frames)
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                keys += await key_latencies(app, probe, 10, near_tail=False)
            rss, peak = rss_mb()
            await pilot.press("q")
        return {
            "pairs": len(session.settled),
            "tokens": app.model.n_tokens,
            "loaded_s": loaded_s,
            "load_cpu_s": load_cpu_s,
            "load_avg": load_avg,
            "start_rss_mb": start_rss,
            "rss_mb": rss,
            "peak_rss_mb": peak,
            "cold_repaint": cold_walls,
            "cold_repaint_cpu": cold_cpu,
            "cold_gc_s": sum(collecting) if len(collecting) % 2 == 0 else 0.0,
            "cold_gc_runs": len(collecting) // 2,
            "frames": frames,
            "keys": keys,
            "loading_frames": loading_frames,
            "loading_keys": loading_keys,
            "loading_lost": loading_lost,
        }

    print("@@TUI" + json.dumps(asyncio.run(run())), flush=True)


def tui_figures(
    work: Path, pairs: int, tensors: int = 2000, seconds: float = 5.0, colds: int = COLD_REPAINTS
) -> dict:
    """The TUI over a real ``open`` session of about ``pairs`` pairs, in a fresh process."""
    import json

    tensors = min(tensors, pairs)
    tokens = max(1, round(pairs / (2 * len(nodes_for(tensors)))))
    golden, target, _ = make_pair(work, tokens, tensors)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, __file__, "--tui-child", str(golden), str(target), str(seconds)]
    cmd.append(str(colds))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("@@TUI")), None)
    if line is None:
        raise RuntimeError(f"TUI bench failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(line[5:])


_OPEN = """
import sys, time
from layerwatch.engine.readers import open_dump
reader = open_dump(sys.argv[2], side="golden")
start, cpu = time.perf_counter(), time.process_time()
if sys.argv[1] == "columns":
    n = reader.open_columns().tensors
else:
    n = len(reader.poll(None, final=True).tensors)
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
with open("/proc/self/status") as fh:
    hwm = next(line for line in fh if line.startswith("VmHWM")).split()[1]
print(n, seconds, cpu, hwm)
"""
"""Opens one dump in a fresh process: ``columns`` (``LayerwatchReader.open_columns``, what
``compare`` does now) or ``records`` (one ``poll``: a record a tensor, as before); prints the
tensors, seconds, CPU seconds (all threads) and peak RSS (kB)."""


def open_figures(golden: Path, how: str) -> tuple[int, float, float, int]:
    """(tensors, seconds, CPU seconds, peak RSS bytes) of opening ``golden`` in a fresh
    process: on a shared box the CPU seconds are the steadier figure."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", _OPEN, how, str(golden)], env=env, capture_output=True, text=True
    )
    if out.returncode:
        raise RuntimeError(out.stderr.strip()[-2000:])
    n, seconds, cpu, hwm = out.stdout.split()
    return int(n), float(seconds), float(cpu), int(hwm) * 1024


def golden_only(
    work: Path, tensors_total: int, tensors: int, stats: bool, index_only: bool = False
) -> Path:
    """A golden dump alone of about ``tensors_total`` tensors (cached): what opening needs;
    ``index_only``: without data files (``write_index_only``)."""
    tokens = max(1, round(tensors_total / (2 * len(nodes_for(tensors)))))
    kind = "i" if index_only else "s" if stats else ""
    base = work / f"open-t{tokens}x{tensors}{kind}"
    done = base / "tensors"
    if not done.is_file():
        shutil.rmtree(base, ignore_errors=True)
        rank = base / "golden" / "cpu_1"
        if index_only:
            n = write_index_only(rank, tokens, tensors)
        else:
            n = write_dump(rank, tokens, tensors, noise=0.0, seed=1, stats=stats)
        done.write_text(str(n))
    return base / "golden"


def open_table(
    work: Path,
    sizes: list[int],
    tensors: int,
    records_max: int,
    stats: bool,
    index_only: bool = False,
) -> None:
    """``--open-only``: open time and peak RSS, columns against records, in the same run (the
    records way only up to ``records_max`` tensors: ~9 µs and ~0.7 KB a tensor)."""
    print("tensors      columns s  CPU s  RSS MB   records s  CPU s  RSS MB   × (CPU)", flush=True)
    for size in sizes:
        golden = golden_only(work, size, tensors, stats, index_only)
        n, seconds, cpu, rss = open_figures(golden, "columns")
        line = f"{n:>11,}  {seconds:8.2f}  {cpu:5.2f}  {rss / 2**20:6.0f}"
        if size <= records_max:
            _, old_s, old_cpu, old_rss = open_figures(golden, "records")
            line += f"  {old_s:9.2f}  {old_cpu:5.1f}  {old_rss / 2**20:6.0f}  {old_cpu / cpu:5.1f}"
        print(line, flush=True)


SESSION_GOAL = 65_536_000
"""Pairs of the 32 768-token × 2 000-node session the live goals are stated for."""


def session_table(work: Path, sizes: list[int], tensors: int, suffix: str, ram: bool) -> None:
    """``--session-only``: ``open --headless`` at each size in fresh processes (the store
    spilled, as ``open`` does unless ``LAYERWATCH_SPILL=never``; ``ram``: also in RAM), then
    the slope of peak RSS between the smallest and the largest size, extrapolated."""
    modes = ("never", "auto") if ram else ("auto",)
    print("pairs      seconds  pairs/s   peak RSS  start RSS  bytes/pair  store")
    got: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for pairs in sizes:
        for mode in modes:
            f = measure(work, pairs, tensors, suffix, mode, command="open")
            got[mode].append(f)
            print(
                f"{f['pairs']:>9,}  {f['seconds']:7.1f}  {f['pairs_per_s']:7.0f}  "
                f"{f['peak_rss_mb']:6.0f} MB  {f['start_rss_mb']:6.0f} MB  "
                f"{f['bytes_per_pair']:8.0f}    {'RAM' if mode == 'never' else 'spilled'}",
                flush=True,
            )
    for mode, figures in got.items():
        if len(figures) < 2:
            continue
        a, b = figures[0], figures[-1]
        slope = (b["peak_rss_mb"] - a["peak_rss_mb"]) * 2**20 / (b["pairs"] - a["pairs"])
        at_goal = b["peak_rss_mb"] + slope * (SESSION_GOAL - b["pairs"]) / 2**20
        print(
            f"slope ({'RAM' if mode == 'never' else 'spilled'}): {slope:.1f} B a pair between "
            f"{a['pairs']:,} and {b['pairs']:,} pairs; {SESSION_GOAL:,} pairs ≈ "
            f"{at_goal:.0f} MB peak RSS",
            flush=True,
        )


def main() -> None:
    if len(sys.argv) == 6 and sys.argv[1] == "--tui-child":
        tui_child(Path(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, nargs="*", default=[100_000, 1_000_000])
    parser.add_argument("--big", action="store_true", help="also 4 M pairs")
    parser.add_argument("--tensors", type=int, default=2000, help="tensors a token")
    parser.add_argument(
        "--ops-per-layer",
        type=int,
        default=len(LAYER_OPS),
        choices=range(1, len(LAYER_OPS) + 1),
        metavar=f"1..{len(LAYER_OPS)}",
        help="leaf operators a layer (fewer: as many layers, fewer pairs a token)",
    )
    parser.add_argument("--suffix", default=".csv", help="report format: .csv .json .jsonl")
    parser.add_argument("--open", action="store_true", help="time opening the golden index")
    parser.add_argument(
        "--session", action="store_true", help="also `open --headless` (the live session)"
    )
    parser.add_argument(
        "--session-only",
        action="store_true",
        help="only `open --headless` (spilled as `open` decides; `--spill`: in RAM, then spilled), "
        "and its slope: bytes a pair between the smallest and largest size, and 65 M pairs",
    )
    parser.add_argument(
        "--tui", type=int, nargs="*", default=[], help="TUI figures over `open` of these pairs"
    )
    parser.add_argument(
        "--cold", type=int, default=COLD_REPAINTS, help="--tui: cold repaints a run once loaded"
    )
    parser.add_argument(
        "--spill",
        action="store_true",
        help="with --session-only: the live session's store in RAM, then spilled",
    )
    parser.add_argument(
        "--open-only",
        type=int,
        nargs="*",
        metavar="TENSORS",
        help="only time opening golden dumps of these many tensors (columns vs records)",
    )
    parser.add_argument(
        "--records-max", type=int, default=4_000_000, help="--open-only: records way up to this"
    )
    parser.add_argument(
        "--byte-chunks",
        action="store_true",
        help="also compare with the windows of before the column index (same-run ratio)",
    )
    parser.add_argument(
        "--index-only",
        action="store_true",
        help="--open-only: write the index alone, with statistics (no torch, no data files)",
    )
    parser.add_argument("--stats", action="store_true", help="statistics on every tensor line")
    parser.add_argument("--format", default="layerwatch", choices=FORMATS)
    parser.add_argument(
        "--before", action="store_true", help="also the whole-run session (the path before)"
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/layerwatch-bench-scale"))
    args = parser.parse_args()
    PER_LAYER[0] = args.ops_per_layer
    if args.open_only:
        args.work.mkdir(parents=True, exist_ok=True)
        open_table(
            args.work, args.open_only, args.tensors, args.records_max, args.stats, args.index_only
        )
        return
    sizes = list(args.pairs) + ([4_000_000] if args.big else [])
    args.work.mkdir(parents=True, exist_ok=True)
    if args.session_only:
        session_table(args.work, sizes, args.tensors, args.suffix, args.spill)
        return
    variants = [("windows", False, False)]
    variants += [("byte-chunk windows", True, False)] if args.byte_chunks else []
    variants += [("whole run", False, True)] if args.before else []
    print(f"{args.format} dumps")
    print("pairs      seconds  pairs/s   peak RSS  start RSS  bytes/pair  path")
    for pairs in sizes:
        for label, byte_chunks, whole in variants:  # compare keeps no store: nothing spills
            f = measure(
                args.work, pairs, args.tensors, args.suffix, "auto", byte_chunks, args.format, whole
            )
            print(
                f"{f['pairs']:>9,}  {f['seconds']:7.1f}  {f['pairs_per_s']:7.0f}  "
                f"{f['peak_rss_mb']:6.0f} MB  {f['start_rss_mb']:6.0f} MB  "
                f"{f['bytes_per_pair']:8.0f}    {label}",
                flush=True,
            )
        if args.session:
            f = measure(args.work, pairs, args.tensors, args.suffix, command="open")
            print(
                f"  open:    {f['seconds']:7.1f}  {f['pairs_per_s']:7.0f}  "
                f"{f['peak_rss_mb']:6.0f} MB  {f['start_rss_mb']:6.0f} MB  "
                f"{f['bytes_per_pair']:8.0f}",
                flush=True,
            )
        if args.open:
            tokens = max(1, round(pairs / (2 * len(nodes_for(min(args.tensors, pairs))))))
            golden, _, _ = make_pair(args.work, tokens, min(args.tensors, pairs))
            n, seconds = time_open(golden)
            print(f"  open index: {n:,} tensors in {seconds:.1f} s", flush=True)
    if args.tui:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_tui import summary_ms as _ms
    for pairs in args.tui:
        t = tui_figures(args.work, pairs, args.tensors, colds=args.cold)
        print(
            f"TUI over open, {t['pairs']:,} pairs ({t['tokens']} tokens): loaded in "
            f"{t['loaded_s']:.1f} s ({t['load_cpu_s']:.1f} s CPU, load average "
            f"{t['load_avg']:.1f}); cold repaint {_ms(t['cold_repaint'])} (UI-thread CPU "
            f"{_ms(t['cold_repaint_cpu'])}, of it collecting "
            f"{1000 * t['cold_gc_s'] / max(len(t['cold_repaint']), 1):.2f} ms a repaint in "
            f"{t['cold_gc_runs']} collections); frame {_ms(t['frames'])};"
            f" key→frame {_ms(t['keys'])}; while loading: frame {_ms(t['loading_frames'])}, "
            f"key→frame {_ms(t['loading_keys'])} ({t['loading_lost']} with no frame in 2 s); RSS {t['rss_mb']:.0f} MB, peak "
            f"{t['peak_rss_mb']:.0f} MB (start {t['start_rss_mb']:.0f} MB)",
            flush=True,
        )


if __name__ == "__main__":
    main()
