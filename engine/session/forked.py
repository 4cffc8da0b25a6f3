"""One call in a forked child process, its result back through a pipe; a queue of work units
that a process and its forked children take from, each as fast as it gets a core.

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
from collections.abc import Callable, Iterator
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


class UnitQueue:
    """Unit numbers ``0 .. count-1`` that several processes take from, each unit once.

    A pipe filled and closed for writing before the fork: every read takes one 4-byte number
    (a pipe read is done under the pipe's lock and the pipe only holds whole numbers, so a
    number is never split between two readers) and reads end at the pipe's end. Nothing is
    sent back and forth per unit, so a process on a busy core simply takes fewer units: static
    shares of estimated cost left the faster process waiting for the slower one.
    ``reserved`` numbers are left out of the pipe (each process's first unit: every forked
    child gets one even when the parent would drain the pipe before the child starts)."""

    SIZE = 4
    LIMIT = 16_384
    """Units at most: the pipe must take them all before anyone reads (64 KiB on Linux)."""

    def __init__(self, count: int, reserved: int = 0) -> None:
        if count > self.LIMIT:
            raise ValueError(f"at most {self.LIMIT} units, not {count}")
        self._read, write_fd = os.pipe()
        try:
            data = b"".join(n.to_bytes(self.SIZE, "little") for n in range(reserved, count))
            view = memoryview(data)
            while view:
                view = view[os.write(write_fd, view) :]
        except BaseException:
            os.close(self._read)
            raise
        finally:
            os.close(write_fd)

    def take(self, first: int | None = None) -> Iterator[int]:
        """``first`` (a reserved unit), then units from the pipe until it is empty."""
        if first is not None:
            yield first
        while True:
            data = os.read(self._read, self.SIZE)
            if not data:
                return
            yield int.from_bytes(data, "little")

    def close(self) -> None:
        if self._read >= 0:
            os.close(self._read)
            self._read = -1


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
