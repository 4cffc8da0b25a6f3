"""Memory and speed of ``layerwatch compare`` as the number of pairs grows (issue: scale).

    . .venv/bin/activate && python tests/bench/bench_scale.py [--pairs 100000 1000000] [--big]

Writes synthetic layerwatch dumps (golden, and a target perturbed by ~1e-7 relative: about an
fp32 rounding, so the pairs pass with real metric values) of N tokens × M tensors with 16-element float32 tensors, through capture's own
format code (``capture/format.py`` index lines, ``capture/safetensors_file.py`` batch files,
one per token), cached under ``--work`` (default ``/tmp/layerwatch-bench-scale``). Then it runs
``layerwatch compare GOLDEN TARGET -o report.csv`` in a fresh process per size and prints
pairs/s, that process's peak RSS (``wait4``), and bytes a pair of RAM above start-up (peak RSS
minus the peak of the same command on a one-token dump, over the pairs). ``--big`` adds 4 M
pairs. ``--open`` also times opening the index alone (``open_dump(...).poll``).
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


def nodes_for(tensors: int) -> list[tuple[str, str]]:
    """Leaf nodes (name, type) giving about ``tensors`` tensors a token (two per node)."""
    layers = max(1, -(-tensors // (2 * len(LAYER_OPS))))
    out = [(f"root.model.layers.{i}.{op}", kind) for i in range(layers) for op, kind in LAYER_OPS]
    return out[: max(1, tensors // 2)]


def write_dump(
    rank_dir: Path,
    tokens: int,
    tensors: int,
    *,
    noise: float,
    seed: int,
    faults: tuple[tuple[int, int], ...] = (),
    diverge_at: int | None = None,
) -> int:
    """One rank directory of ``tokens`` × ~``tensors`` tensors; returns the tensors written.

    ``faults``: (token, node index) whose output is 10 % off from then on (a fault the session
    must find); ``diverge_at``: this side was fed other input ids from that token on."""
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
            values = golden.standard_normal((len(nodes), 2, ELEMENTS), dtype=np.float32)
            if noise:
                values *= 1 + noise * perturb.standard_normal(values.shape, dtype=np.float32)
            for at, node in faults:
                if token >= at:
                    values[node, 1] *= 1.1
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
                        None,
                    )
                    lines.append(lwf.encode_line(entry.to_json()))
            index.write("".join(lines))
            count += len(lines) - 1
        index.write(lwf.encode_line({"k": lwf.K_END, "status": "complete", "tokens": tokens}))
    return count


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
        values = golden.standard_normal((len(nodes), 2, ELEMENTS), dtype=np.float32)
        if noise:  # not the embedding's: a gather adds no rounding (its local verdict says so)
            values[1:] *= 1 + noise * perturb.standard_normal(values[1:].shape, dtype=np.float32)
        for at, node in faults:
            if token >= at:
                values[node, 1] *= 1.1
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
        values = golden.standard_normal((len(nodes), 2, ELEMENTS), dtype=np.float32)
        if noise:
            values *= 1 + noise * perturb.standard_normal(values.shape, dtype=np.float32)
        for at, node in faults:
            if token >= at:
                values[node, 1] *= 1.1
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
        values = golden.standard_normal((len(nodes), 2, ELEMENTS), dtype=np.float32)
        if noise:
            values *= 1 + noise * perturb.standard_normal(values.shape, dtype=np.float32)
        for at, node in faults:
            if token >= at:
                values[node, 1] *= 1.1
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
    base = work / f"{'' if fmt == 'layerwatch' else fmt + '-'}t{tokens}x{tensors}n{noise:g}"
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
import sys
from layerwatch.tui.cli import main
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
    golden: Path, target: Path, report: Path, *extra: str, whole: bool = False
) -> Figures:
    """``layerwatch compare`` in a fresh process (``whole``: the whole-run session instead);
    its own peak RSS."""
    if whole:
        cmd = [sys.executable, "-c", _WHOLE, str(golden), str(target), str(report)]
    else:
        cmd = [sys.executable, "-c", _WRAPPER, "compare", str(golden), str(target)]
        cmd += ["-o", str(report), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
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
    fmt: str = "layerwatch",
    whole: bool = False,
) -> dict[str, float]:
    """Pairs/s, peak RSS and bytes a pair above start-up for about ``pairs`` pairs of ``fmt``
    dumps (``whole``: the whole-run session, the path before windows)."""
    tensors = min(tensors, pairs)
    tokens = max(1, round(pairs / (2 * len(nodes_for(tensors)))))
    g0, t0, _ = make_pair(work, 1, tensors, fmt=fmt)
    base = run_compare(g0, t0, work / f"base{suffix}", whole=whole)
    golden, target, n = make_pair(work, tokens, tensors, fmt=fmt)
    fig = run_compare(golden, target, work / f"report{suffix}", whole=whole)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, nargs="*", default=[100_000, 1_000_000])
    parser.add_argument("--big", action="store_true", help="also 4 M pairs")
    parser.add_argument("--tensors", type=int, default=2000, help="tensors a token")
    parser.add_argument("--suffix", default=".csv", help="report format: .csv .json .jsonl")
    parser.add_argument("--open", action="store_true", help="time opening the golden index")
    parser.add_argument("--format", default="layerwatch", choices=FORMATS)
    parser.add_argument(
        "--before", action="store_true", help="also the whole-run session (the path before)"
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/layerwatch-bench-scale"))
    args = parser.parse_args()
    sizes = list(args.pairs) + ([4_000_000] if args.big else [])
    args.work.mkdir(parents=True, exist_ok=True)
    print(f"{args.format} dumps")
    print("pairs      seconds  pairs/s   peak RSS  start RSS  bytes/pair  path")
    for pairs in sizes:
        for whole in (False, True) if args.before else (False,):
            f = measure(args.work, pairs, args.tensors, args.suffix, args.format, whole)
            print(
                f"{f['pairs']:>9,}  {f['seconds']:7.1f}  {f['pairs_per_s']:7.0f}  "
                f"{f['peak_rss_mb']:6.0f} MB  {f['start_rss_mb']:6.0f} MB  "
                f"{f['bytes_per_pair']:8.0f}    {'whole run' if whole else 'windows'}",
                flush=True,
            )
        if args.open:
            tokens = max(1, round(pairs / (2 * len(nodes_for(min(args.tensors, pairs))))))
            golden, _, _ = make_pair(args.work, tokens, min(args.tensors, pairs))
            n, seconds = time_open(golden)
            print(f"  open index: {n:,} tensors in {seconds:.1f} s", flush=True)


if __name__ == "__main__":
    main()
