"""``layerwatch precheck`` speed: MB of dump recomputed per second, beside just reading it.

Run (from the repository root, in the project venv)::

    OMP_NUM_THREADS=1 python tests/bench/bench_precheck.py [--hidden 512] [--layers 4] [--prompt 128]

Captures a Hugging Face ``LlamaForCausalLM`` (random weights, bf16, eager attention, greedy
``generate`` of 4 new tokens on a fixed prompt) with ``dump_weight=True``, then in the same
process times (median of 3) (a) reading the dump and loading every tensor and weight once
(``load_array``: the floor any check pays) and (b) ``precheck(dump)``. Prints MB/s of dump for
both (dump bytes = the data files).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from layerwatch.capture import DumpConfig, register_hook
from layerwatch.engine.precheck import precheck
from layerwatch.engine.readers import open_dump
from layerwatch.engine.readers.load import load_array
from transformers import LlamaConfig, LlamaForCausalLM


def read_all(dump: Path) -> int:
    update = open_dump(dump).poll(None, final=True)
    n = 0
    for record in update.tensors:
        if record.loc is not None:
            n += load_array(record.loc).size
    for loc in update.weights.values():
        n += load_array(loc).size
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=128)
    args = ap.parse_args()
    torch.manual_seed(1234)
    cfg = LlamaConfig(
        hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4, num_hidden_layers=args.layers,
        num_attention_heads=8, num_key_value_heads=8, vocab_size=8000, attn_implementation="eager",
    )  # fmt: skip
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    ids = torch.randint(0, 8000, (1, args.prompt))
    with tempfile.TemporaryDirectory() as tmp:
        config = DumpConfig(dump_path=tmp, dump_weight=True)
        with register_hook(model, config) as handle, torch.no_grad():
            model.generate(ids, max_new_tokens=4, do_sample=False)
        dump = handle.run_dir
        assert dump is not None
        mb = sum(p.stat().st_size for p in (dump / "data").iterdir()) / 1e6
        reads, checks = [], []
        for _ in range(3):
            t0 = time.perf_counter()
            read_all(dump)
            reads.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            report = precheck(dump)
            checks.append(time.perf_counter() - t0)
        read_s, check_s = statistics.median(reads), statistics.median(checks)
        print(
            f"dump {mb:.1f} MB, {report.checked} ops checked, {len(report.failed)} failed: "
            f"read+load {read_s:.2f} s ({mb / read_s:.0f} MB/s), "
            f"precheck {check_s:.2f} s ({mb / check_s:.0f} MB/s, {check_s / read_s:.1f}× the read)"
        )


if __name__ == "__main__":
    main()
