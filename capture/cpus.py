"""Cores this process may use, and whether one is likely idle: the one rule for the helpers
that pay off only on a core the box is not using — the compare's reader thread
(engine/numerics/compare.py) and the compare's forked children under ``--jobs 0``
(engine/session/jobs.py). The capture's writer process (capture/writer_process.py) needs
only a second core, busy or not (:func:`second_core`)."""

from __future__ import annotations

import math
import os


def cores() -> int:
    """Cores this process may run on (its affinity, where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def spare_cores() -> int:
    """Cores the one-minute load average leaves idle: ``cores − ½ − load`` rounded up, 0 or
    more (2 cores: 1 below load 1.5, 0 from there; no load average, as on Windows: all)."""
    n = cores()
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average (Windows): assume the cores are there
        return n
    return max(0, min(n, math.ceil(n - 0.5 - load)))


def spare_core() -> bool:
    """Two or more cores and the one-minute load average below ``cores − ½``. On a core the
    box is using anyway a helper saves no time and costs more CPU: the reader thread ~7 % for
    streamed pairs (its copies land in another core's cache; bench case (a) at load 4–7 on the
    2-core development box)."""
    return cores() >= 2 and spare_cores() >= 1


def second_core() -> bool:
    """Whether this process may run on two cores or more, busy or not. A writer process pays
    off on a loaded box too: it is one more task the scheduler shares the cores with, instead
    of a thread that takes the model's GIL (``bench_dump.py --cli`` at load 4.5-7.5 on the
    2-core box, same run: ``generate`` 1.80x with the writer process, 3.14x with the thread
    writer; README's dump-overhead row). Not :func:`spare_core` (idle cores only), which the
    compare's reader thread keeps."""
    return cores() >= 2
