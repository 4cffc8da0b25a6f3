"""One call in a forked child process, its result back through a pipe.

The cheapest way for a single-threaded process to use a second core: ``fork`` costs a few
milliseconds, nothing is pickled on the way in (the child has the parent's memory: records,
thresholds, imported modules), only the result on the way out. A process pool costs ~30 ms to
start (imports, queues, a manager thread) and pickles every argument. Used only where fork is
safe (:func:`can_fork`: Linux, no other Python thread); elsewhere callers use the pool.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


def can_fork() -> bool:
    """Linux and a single thread: a forked child cannot inherit a lock held by another thread.
    (macOS forbids fork after some system libraries started, hence Linux only.)"""
    return sys.platform.startswith("linux") and threading.active_count() == 1


class Forked(Generic[T]):
    """``fn(*args)`` running in a child process from construction on; :meth:`result` waits."""

    def __init__(self, fn: Callable[..., T], *args: object) -> None:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: compute, send, leave without running any parent cleanup
            code = 0
            try:
                os.close(read_fd)
                try:
                    payload = pickle.dumps((True, fn(*args)), protocol=pickle.HIGHEST_PROTOCOL)
                except BaseException as exc:
                    payload = pickle.dumps((False, _portable(exc)))
                with open(write_fd, "wb", closefd=True) as out:
                    out.write(payload)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(write_fd)
        self._pid = pid
        self._fd = read_fd
        self._done = False

    def result(self) -> T:
        """The call's return value; its exception re-raised here; ``ChildProcessError`` when the
        child died without an answer (killed, out of memory)."""
        if self._done:
            raise RuntimeError("result() was already taken")
        self._done = True
        with open(self._fd, "rb", closefd=True) as pipe:
            data = pipe.read()
        _, status = os.waitpid(self._pid, 0)
        if not data:
            raise ChildProcessError(f"worker process ended without a result ({_how(status)})")
        ok, value = pickle.loads(data)
        if ok:
            return value
        raise value

    def __del__(self) -> None:
        if not self._done:  # never collected: do not leave a zombie or a blocked child
            try:
                os.close(self._fd)
                os.waitpid(self._pid, 0)
            except OSError:
                pass


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a RuntimeError with its one-line text."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        first = f"{type(exc).__name__}: {exc}".splitlines()[0]
        return RuntimeError(first)
    return exc


def _how(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"
