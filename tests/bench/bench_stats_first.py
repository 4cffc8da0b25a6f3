"""Statistics-first capture vs a full dump: time and disk for 256 tokens of the demo model.

    OMP_NUM_THREADS=1 python tests/bench/bench_stats_first.py [--tokens 256] [--keep 8]

Three runs of the demo model (capture/demo, fp32, greedy; its positions widened to fit): no capture, a full dump, and a
statistics-first dump (``DumpConfig(keep_tokens=K)``); each captured run ends with
``HookHandle.close()`` (everything on disk). Printed: wall time of each, and the bytes left in
each dump directory (data files + index). The figures in README come from this script.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from layerwatch.capture import DumpConfig, register_hook
from layerwatch.capture.demo import DemoConfig, build_model, generate, make_prompt


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--keep", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=16)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="lw-bench-sf-"))
    try:
        results = {}
        for name, keep in (("none", None), ("full", None), ("stats-first", args.keep)):
            cfg = DemoConfig()
            cfg = replace(cfg, max_seq_len=max(cfg.max_seq_len, args.prompt + args.tokens))
            model = build_model(config=cfg)
            prompt = make_prompt(args.prompt, vocab_size=model.cfg.vocab_size)
            out = tmp / name
            start = time.perf_counter()
            if name == "none":
                generate(model, prompt, args.tokens)
            else:
                handle = register_hook(model, DumpConfig(dump_path=out, keep_tokens=keep))
                generate(model, prompt, args.tokens)
                handle.close()
            results[name] = (time.perf_counter() - start, _bytes(out) if out.exists() else 0)
        base = results["none"][0]
        for name, (secs, size) in results.items():
            print(f"{name:12} {secs:7.2f} s ({secs / base:4.2f}x)  {size / 2**20:9.2f} MiB")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
