"""Handing the GIL back to a front end's UI thread quickly while the engine worker runs.

``open`` of a finished dump keeps the worker busy for tens of seconds (read a part, pair,
compare, settle), mostly in Python, so it holds the GIL. The TUI's event loop gives the GIL up
at every ``select`` — several times between a key and the frame that shows it — and each time
it wants it back CPython makes it wait a whole switch interval (5 ms by default) before asking
the worker to let go; a garbage collection the worker runs meanwhile (0.01-0.06 s over what it
allocated since the last freeze, :mod:`.gc_tuning`) cannot be interrupted at all.

While the worker runs, :func:`ui_first` therefore sets two process-wide things, and puts both
back when the worker ends (so only a front end that owns the process asks for it:
``LivePipeline.share_gil``):

- the switch interval to :data:`SWITCH_S`: a thread waiting for the GIL gets it within ~1 ms.
  A lone worker is not made to switch (nobody asks for the GIL), so loading is not slower;
- with a :class:`.gc_tuning.HeapFreezer` ticking (``freeze_heap``), no *automatic* full
  collections: the freezer already collects everything not yet frozen once a second before it freezes,
  and the automatic ones came on top (23 of 35 full collections in a 100 k-pair load, each
  one walking the same not-yet-frozen objects). Young collections are untouched.

Measured on ``tests/bench/bench_scale.py --tui 100000`` (the TUI over ``open`` of 100 k pairs,
200×50, 2 shared cores, the build before alternated in the same run): key → frame while
loading p95 44 ms against 54 ms at load 2-3 (~600 and ~500 keys), 37 against 42 ms at load
1-1.5; 2 ms switches gave 36 ms where 1 ms gave 30 (load 1.5), 0.5 ms no better than 1. The
load itself (the worker with a thread draining 20 times a second, no TUI) takes 0.97× the
wall time and 0.98× the CPU (medians of 6 alternated pairs): a lone worker is not made to
switch.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager

SWITCH_S = 0.001
"""GIL switch interval while the worker runs (CPython's default: 0.005 s)."""
NO_AUTO_FULL = 1 << 30
"""Generation-2 threshold that no run reaches: full collections only when called for."""


@contextmanager
def ui_first(*, freezer_collects: bool) -> Iterator[None]:
    """Short GIL switches (and, when ``freezer_collects``, no automatic full collections)
    inside the block; the settings found before are put back after it, unless something else
    changed them meanwhile."""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_S)
    ours = sys.getswitchinterval()  # as the interpreter rounds it (whole microseconds)
    thresholds = gc.get_threshold()
    held = (*thresholds[:2], NO_AUTO_FULL)
    if freezer_collects:
        gc.set_threshold(*held)
    try:
        yield
    finally:
        if sys.getswitchinterval() == ours:
            sys.setswitchinterval(switch)
        if freezer_collects and gc.get_threshold() == held:
            gc.set_threshold(*thresholds)
