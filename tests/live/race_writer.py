"""A writer that races a watcher: run as a separate process by the watcher reliability tests.

``python race_writer.py DIR N SEED [--stuck K]`` writes N framed files (ATB ``.bin``: header
with ``$Object.Length``, then a payload whose bytes are a function of the file number) under
``DIR/r{k}/{token}/``, creating directories as it goes. A third are renamed into place, a third
are written in place in two chunks, and a third are left half-written while the next ~40 files
are written, then finished: long windows in which a careless watcher would report a partial
file. ``--stuck K`` leaves K files half-written for ever (a crash). Prints ``DONE`` at the end.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path


def header(n: int) -> bytes:
    return (
        f"$Version=1.0\n$Object.Count=1\n$Object.Length={n}\nformat=2\ndtype=2\n"
        f"dims={n}\n$Object.data=0,{n}\n$End=1\n"
    ).encode()


def payload(i: int, n: int) -> bytes:
    return bytes((i * 7 + j) % 251 for j in range(min(n, 251))) * (n // 251 + 1)


def expected(path: Path) -> bytes:
    """What a complete file named ``f{i}_{n}.bin`` holds (the tests verify arrivals with it)."""
    i, n = (int(x) for x in path.stem[1:].split("_"))
    return header(n) + payload(i, n)[:n]


def main() -> None:
    root, count, seed = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    stuck = int(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[4] == "--stuck" else 0
    rng = random.Random(seed)
    open_files: list[tuple[object, bytes]] = []
    directory = root
    for i in range(count):
        if i % 250 == 0:
            directory = root / f"r{i // 2500}" / str(i // 250)
            directory.mkdir(parents=True, exist_ok=True)
        n = rng.choice((0, 1, 17, 4096, rng.randrange(1, 64 << 10)))
        path = directory / f"f{i}_{n}.bin"
        data = header(n) + payload(i, n)[:n]
        mode = i % 3
        if mode == 0:
            tmp = path.with_name(".tmp-" + path.name)
            tmp.write_bytes(data)
            os.replace(tmp, path)
        elif mode == 1:
            with open(path, "wb") as fh:
                cut = rng.randrange(len(data) + 1)
                fh.write(data[:cut])
                fh.flush()
                fh.write(data[cut:])
        else:
            fh = open(path, "wb")  # noqa: SIM115 - finished later, on purpose
            cut = rng.randrange(len(data))
            fh.write(data[:cut])
            fh.flush()
            open_files.append((fh, data[cut:]))
        while len(open_files) > 40 or (open_files and i == count - 1):
            fh, rest = open_files.pop(0)
            if i >= count - 1 and len(open_files) < stuck:
                fh.close()  # closed half-written: a crashed writer
                continue
            fh.write(rest)
            fh.close()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
