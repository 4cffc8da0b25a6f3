"""A stand-in for ``msit llm dump`` (there is no NPU/CANN here): same command line, same
environment for the launched command, and an ATB dump written the way the CANN probe writes it —
in place, each ``.bin`` header first and its payload a moment later, while the command runs.

Tests put a ``msit`` wrapper first on PATH that runs this file. Knobs (environment):
``FAKE_MSIT_TOKENS`` executions to dump (3), ``FAKE_MSIT_DELAY`` seconds between a file's header
and its payload (0.01), ``FAKE_MSIT_FAULT`` an op directory name whose outputs are scaled by 1.5
(a "bug" in the target), ``FAKE_MSIT_RECORD`` a file to write the parsed arguments to.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.atb import ACL, Op, bin_bytes

DIM, SEQ, VOCAB = 16, 4, 32


def model_ops() -> list[tuple[str, list[str]]]:
    """The op directories of one execution, children listed under their parent."""
    layer = ["0_RmsNormOperation", "1_LinearOperation"]
    return [
        ("0_WordEmbedding", []),
        ("1_DecoderLayer", layer),
        ("2_DecoderLayer", layer),
        ("3_RmsNormOperation", []),
        ("4_LmHead", []),
    ]


def values(path: str, token: int, shape: tuple[int, ...]) -> np.ndarray:
    seed = zlib.crc32(f"{path}@{token}".encode())  # stable across processes
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="msit")
    p.add_argument("tool")
    p.add_argument("command")
    p.add_argument("--exec", required=True)
    p.add_argument("-o", "--output", default="./")
    p.add_argument("--type", nargs="+", default=["tensor", "model"])
    p.add_argument("-er", "--execute-range", default="0,0")
    p.add_argument("-stp", "--save-tensor-part", default="2")
    p.add_argument("-opname", "--operation-name", default=None)
    p.add_argument("-seed", default=None)
    p.add_argument("-device", "--device-id", default="0")
    args = p.parse_args(argv)
    if (args.tool, args.command) != ("llm", "dump"):
        p.error("only `msit llm dump` is emulated")
    return args


def in_range(token: int, spec: str) -> bool:
    bounds = [int(x) for x in spec.split(",")]
    return any(lo <= token <= hi for lo, hi in zip(bounds[::2], bounds[1::2], strict=False))


def write_slowly(path: Path, data: bytes, delay: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cut = data.index(b"$End=1\n") + 7
    with open(path, "wb") as fh:  # in place, like the probe: a watcher must wait for the payload
        fh.write(data[:cut])
        fh.flush()
        time.sleep(delay)
        fh.write(data[cut:])


def probe(dump: Path, pid: int, args: argparse.Namespace, stop: threading.Event) -> None:
    tokens = int(os.environ.get("FAKE_MSIT_TOKENS", "3"))
    delay = float(os.environ.get("FAKE_MSIT_DELAY", "0.01"))
    fault = os.environ.get("FAKE_MSIT_FAULT", "")
    part = args.save_tensor_part
    model = dump / "model" / str(pid)
    model.mkdir(parents=True, exist_ok=True)
    ops = [
        Op(name.split("_", 1)[1], children=[Op(c.split("_", 1)[1]) for c in kids])
        for name, kids in model_ops()
    ]
    topo = {
        "modelName": "FakeLlama",
        "inTensors": [],
        "outTensors": [],
        "nodes": [op.topology(i, f"n{i}") for i, op in enumerate(ops)],
    }
    (model / "FakeLlama.json").write_text(json.dumps(topo, indent=1))
    rank = dump / "tensors" / f"{args.device_id}_{pid}"
    for token in range(tokens):
        if not in_range(token, args.execute_range):
            continue
        for name, kids in model_ops():
            for sub in [*[f"{name}/{k}" for k in kids], name]:  # children finish first
                if stop.is_set():
                    return
                if args.operation_name and not sub.split("/")[-1].split("_", 1)[
                    1
                ].lower().startswith(args.operation_name.lower()):
                    continue
                where = rank / str(token) / sub
                if part in ("0", "2"):
                    if name == "0_WordEmbedding":
                        ids = np.arange(token, token + SEQ, dtype=np.int64) % VOCAB
                        data = bin_bytes(ids.tobytes(), ACL["int64"], ids.shape)
                    else:
                        x = values(sub + "/in", token, (SEQ, DIM))
                        data = bin_bytes(x.tobytes(), ACL["float32"], x.shape)
                    write_slowly(where / "before" / "intensor0.bin", data, delay)
                if part in ("1", "2"):
                    shape = (SEQ, VOCAB) if name == "4_LmHead" else (SEQ, DIM)
                    y = values(sub + "/out", token, shape)
                    if fault and fault in sub.split("/"):
                        y = y * 1.5
                    write_slowly(
                        where / "after" / "outtensor0.bin",
                        bin_bytes(y.tobytes(), ACL["float32"], y.shape),
                        delay,
                    )


def main() -> int:
    args = parse(sys.argv[1:])
    record = os.environ.get("FAKE_MSIT_RECORD")
    if record:
        Path(record).write_text(json.dumps({"argv": sys.argv[1:], **vars(args)}))
    dump = Path(args.output) / time.strftime("msit_dump_%Y%m%d_%H%M%S")
    env = dict(os.environ, ATB_SAVE_TENSOR="1", ATB_OUTPUT_DIR=str(dump), ATB_SAVE_TENSOR_RANGE=args.execute_range,
               ATB_SAVE_TENSOR_PART=args.save_tensor_part, ATB_DUMP_TYPE="|".join(args.type))  # fmt: skip
    try:
        cmd = subprocess.Popen(args.exec.split(" "), env=env)
    except OSError as exc:
        print(
            f"Traceback (most recent call last):\n{type(exc).__name__}: {exc}\nException: [ERROR] Refer FAQ if a known issue"
        )
        return 1
    stop = threading.Event()
    writer = threading.Thread(target=probe, args=(dump, cmd.pid, args, stop))
    writer.start()
    code = cmd.wait()
    if code != 0:
        stop.set()  # the process the probe lives in is gone
    writer.join()
    return code


if __name__ == "__main__":
    sys.exit(main())
