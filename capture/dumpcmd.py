"""``layerwatch dump``: run one command with capture on, forward signals, summarise the dump.

Ctrl-C/SIGTERM/SIGHUP reach layerwatch (the child sits in its own session, out of the
terminal's reach) and are forwarded to the child's whole process group; a second Ctrl-C, or
the grace period running out, sends SIGKILL. The exit code is the child's (128+N when a signal
ended it), or 127 when the command cannot be started.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from .errors import LayerwatchError
from .format import INDEX, K_END, K_ERROR, K_TENSOR, K_TOKEN
from .launch import CaptureOptions, Child, LaunchSpec, default_grace

EXIT_NOT_FOUND = 127
FOLLOW_REFUSED = "follow: token "
"""How ``capture/follow.py`` begins the line that stops a run whose input ids left the golden's."""
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_TENSOR_HEAD = b'{"k":"%s",' % K_TENSOR.encode()
"""How every tensor line the writers write begins (``capture/index_lines.py``)."""
_CHUNK = 1 << 22
"""Index bytes read at a time: memory stays bounded whatever the run's length."""


def supervise(
    child: Child, grace: float | None = None, tick: Callable[[], bool] | None = None
) -> int:
    """Wait for ``child``, forwarding the signals we receive; returns its exit code.

    ``tick`` (e.g. the engine's live scan over the dump) runs every 50 ms while the child
    lives; when it returns true the child is stopped with SIGINT (Python children then run
    their ``atexit`` handlers, so the dump ends complete) and SIGKILL after ``grace``."""
    grace = default_grace() if grace is None else grace
    received: list[int] = []
    previous = {}
    for sig in _FORWARDED:
        try:
            previous[sig] = signal.signal(sig, lambda signum, _frame: received.append(signum))
        except ValueError:  # not the main thread: no forwarding, plain wait
            break
    kill_at: float | None = None
    try:
        while child.wait(0.05) is None:
            if tick is not None and kill_at is None and tick():
                child.send(signal.SIGINT)
                kill_at = time.monotonic() + grace
            while received:
                signum = received.pop(0)
                if kill_at is not None and signum == signal.SIGINT:
                    kill_at = time.monotonic()  # a second Ctrl-C: no more patience
                    break
                child.send(signum)
                kill_at = kill_at or time.monotonic() + grace
            if kill_at is not None and time.monotonic() >= kill_at:
                child.stop(signal.SIGKILL, 0)
        if child.stopped_by is not None:
            child.stop(signal.SIGTERM, min(grace, 1.0))  # leftovers of the group
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    code = child.exit_code
    return 1 if code is None else code


def count_dump(out: Path) -> tuple[int, int, int, list[str]]:
    """(ranks, tokens, tensors, messages) of what landed in ``out``, any supported layout."""
    ranks = tokens = tensors = 0
    messages: list[str] = []
    for index in sorted(out.glob(f"*/{INDEX}")):
        ranks += 1
        seen_tokens = set()
        with index.open("rb") as f:
            lines = f.readlines(_CHUNK)
            while lines:
                for line in lines:
                    # Tensor lines are counted, not decoded: they are nearly all of a long
                    # run's index (decoding 80 k of them took 0.44 s after a 512-token run).
                    if line.startswith(_TENSOR_HEAD) and line.endswith(b"\n"):
                        tensors += 1
                        continue
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue  # a torn last line: the reader ignores it too
                    kind = rec.get("k") if isinstance(rec, dict) else None
                    if kind == K_TENSOR:
                        tensors += 1
                    elif kind == K_TOKEN:
                        seen_tokens.add(rec.get("token"))
                    elif kind == K_ERROR or (
                        kind == K_END and rec.get("status") not in (None, "complete")
                    ):
                        messages.append(str(rec.get("message") or rec.get("status")))
                lines = f.readlines(_CHUNK)
        tokens = max(tokens, len(seen_tokens))
    for rank in sorted(out.glob("msit_dump_*/*tensors/*_*")):  # msit .pth or ATB .bin
        ranks += 1
        token_dirs = [d for d in rank.iterdir() if d.is_dir() and d.name.isdigit()]
        tokens = max(tokens, len(token_dirs))
        tensors += sum(1 for d in token_dirs for p in d.rglob("*") if p.suffix in (".pth", ".bin"))
    return ranks, tokens, tensors, messages


def run_dump(args: object, tick: Callable[[Path], Callable[[], bool]] | None = None) -> int:
    """``tick(out)``: made once the child started, called while it runs (see :func:`supervise`)."""
    cmd = list(getattr(args, "cmd", None) or [])
    if not cmd:
        raise LayerwatchError(
            "no command given: layerwatch dump --out DIR -- python infer.py ARGS..."
        )
    shell = bool(getattr(args, "shell", False))
    spec = LaunchSpec(
        cmd=" ".join(cmd) if shell and len(cmd) == 1 else cmd,
        out=Path(getattr(args, "out")).absolute(),  # noqa: B009
        options=CaptureOptions.from_args(args),
        dumper=getattr(args, "dumper", "layerwatch") or "layerwatch",
        shell=shell,
    )
    child = Child(spec)
    try:
        child.start()
    except LayerwatchError as exc:
        print(f"layerwatch dump: {exc}", file=sys.stderr)
        return EXIT_NOT_FOUND if "not found" in str(exc) or "not executable" in str(exc) else 2
    print(
        f"layerwatch dump: pid {child.pid} → {spec.out} (output in {spec.log_path})",
        file=sys.stderr,
    )
    code = supervise(child, tick=None if tick is None else tick(spec.out))
    ranks, tokens, tensors, messages = count_dump(spec.out)
    what = f"{tokens} tokens, {tensors} tensors" + (f" from {ranks} processes" if ranks > 1 else "")
    if ranks == 0 and spec.dumper == "layerwatch":
        what = "nothing captured (did it run a torch model in Python, without python -I/-S?)"
    messages += [
        t[len("layerwatch: ") :] for t in child.log_tail(40) if t.startswith("layerwatch: ")
    ]
    refused = next((m for m in messages if m.startswith(FOLLOW_REFUSED)), None)
    line = f"layerwatch dump: {child.describe()} · {what} in {spec.out}"
    if messages:
        line += f" · capture: {messages[0]}"
    print(line, flush=True)
    if refused is not None:  # the target could not follow the golden run: unusable input
        print(f"layerwatch dump: {refused}", file=sys.stderr)
        return 2
    if code != 0 and child.stopped_by is None:  # we stopped it: its traceback is ours
        for text in child.log_tail(10):
            print(f"  | {text}", file=sys.stderr)
    return code
