"""Keeping CPython's full collections from walking the model process's heap during a capture.

A capture allocates a few objects a tensor (the item, the de-duplication entry) that live until
the writer has written them, ~50-100 ms: long enough to reach the oldest generation. Every
time enough of them got there, CPython runs a full collection, which walks *every* object of
the process: after ``import transformers`` that is ~340 k objects and 0.2 s with the GIL held,
in which the model does not run (measured on the 512-token run of ``tests/bench/bench_dump.py``:
one such pass per ~80 k tensors, a sixth of the whole capture cost). The objects that existed
before the capture (modules, the model, imported code) are not garbage-collected by those
passes in practice, so the first capture of a process freezes them (``gc.freeze()``, constant
time) and the last one to close thaws them again (``gc.unfreeze()``): collections during the
capture walk only what was allocated since. Reference counting frees frozen objects as usual;
only a cycle that becomes garbage while frozen waits for the thaw.

A process that froze its heap itself (``gc.get_freeze_count() > 0`` before the first capture:
a pre-fork server, or the engine's ``engine/live/gc_tuning.py``) is left alone: it manages its
own heap, and thawing would undo its freeze.
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_holders = 0
"""Open captures that hold the freeze (the freeze is ours only while this is above zero)."""


def hold() -> bool:
    """A capture starts: freeze the heap if nobody froze it; whether this capture holds it."""
    global _holders
    with _lock:
        if _holders == 0 and gc.get_freeze_count() > 0:
            return False  # frozen by the program: not ours to thaw
        if _holders == 0:
            gc.freeze()
        _holders += 1
        return True


def release() -> None:
    """A capture that :func:`hold` returned true for ended: the last one thaws the heap."""
    global _holders
    with _lock:
        if _holders == 0:
            return
        _holders -= 1
        if _holders == 0:
            gc.unfreeze()


def forget() -> None:
    """In a forked child: the parent's captures are gone, their freeze is the child's now."""
    global _holders
    _holders = 0
