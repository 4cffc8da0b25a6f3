"""Process-tree helpers for the launcher: who is still alive in a child's group or subtree.

Children are started in a new session, so the child's process group holds everything it
spawned unless a descendant made its own session (some launchers do). Stopping therefore
signals the group *and* every descendant found through ``/proc`` parent links, and only calls
it done when none of them is left. Linux only (``/proc``); elsewhere only the group is used.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ProcInfo:
    pid: int
    ppid: int
    pgrp: int
    state: str


def _read_stat(pid: int) -> ProcInfo | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    # "pid (comm) state ppid pgrp ...": comm may contain spaces and parentheses.
    rest = raw[raw.rfind(")") + 2 :].split()
    if len(rest) < 3:
        return None
    return ProcInfo(pid, int(rest[1]), int(rest[2]), rest[0])


def processes() -> list[ProcInfo]:
    """Every live (non-zombie) process visible in ``/proc``."""
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []
    infos = (_read_stat(pid) for pid in pids)
    return [info for info in infos if info is not None and info.state not in ("Z", "X")]


def alive(pid: int, pgid: int, known: set[int] | None = None) -> set[int]:
    """Live processes of group ``pgid`` plus ``pid``'s descendants (any group), plus ``known``
    pids still running (descendants seen earlier whose parent has since died)."""
    procs = processes()
    by_parent: dict[int, list[int]] = {}
    live = set()
    for info in procs:
        by_parent.setdefault(info.ppid, []).append(info.pid)
        live.add(info.pid)
    found = {info.pid for info in procs if info.pgrp == pgid}
    stack = [pid]
    while stack:
        for child in by_parent.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    if pid in live:
        found.add(pid)
    if known:
        found |= known & live
    found.discard(os.getpid())
    return found


def signal_all(pgid: int, pids: set[int], sig: int) -> None:
    """Send ``sig`` to the group and to each pid; processes that are gone are skipped."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
