"""Will a compare fit in memory? Estimated from the index before anything is compared.

A compare that does not fit must end in one line naming the filters that make it fit, not in a
process the kernel kills an hour in. Bytes a pair are this repository's measured figures
(tests/bench/bench_scale.py) rounded up: a windowed compare (engine/session/windowed.py) keeps
``STORE_BYTES`` a pair plus one window, a whole-run session ``SESSION_BYTES`` a pair.

A windowed compare whose store would not fit spills it (engine/session/store.py): full chunks
go to a file, RAM keeps ``SPILLED_BYTES`` a pair and ``TOKEN_BYTES`` a token (string tables,
token ids) plus ``SPILL_RAM``; the disk needs ``DISK_BYTES`` a pair. Only what does not fit
even then is refused. ``LAYERWATCH_SPILL=always|never`` forces it on or off (the bench compares
both); ``LAYERWATCH_SPILL_DIR`` moves the files (default: beside the ``-o`` report, else the
temporary directory).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from layerwatch.capture.errors import LayerwatchError

STORE_BYTES = 256
"""A pair in the result store, with room to spare (measured ~170)."""
SESSION_BYTES = 6_000
"""A pair held by a whole-run CompareSession: both records, raw and reported result (~5.4 KB)."""
WINDOW_BYTES = 160 << 20
"""One window's records and results while it is compared, and the interpreter's own growth."""
SPILLED_BYTES = 16
"""A pair in a spilled store (measured ~1: what grows is per distinct name, not per pair)."""
TOKEN_BYTES = 2_048
"""A token in a spilled windowed run: its data files' paths in the store, its input ids."""
SPILL_RAM = 64 << 20
"""A spilled store's chunks being filled and its read cache (engine/session/store.py: ~44 MB)."""
DISK_BYTES = 256
"""A pair in the spill files (measured ~170: 104 B of row and its metric values)."""

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``8G``, ``512M``, ``1.5GiB``, ``100000`` (bytes) → bytes; one line on anything else."""
    match = _SIZE.match(text)
    if match is None:
        raise LayerwatchError(f"--max-memory {text!r}: expected a size such as 8G or 512M")
    unit = " KMGT".index(match.group(2).upper() or " ")
    return int(float(match.group(1)) * 1024**unit)


def available() -> int | None:
    """``MemAvailable`` of /proc/meminfo in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def spill_mode() -> str:
    """``auto`` (spill when the store would not fit), ``always`` or ``never``."""
    mode = os.environ.get("LAYERWATCH_SPILL", "auto").strip().lower() or "auto"
    if mode not in ("auto", "always", "never"):
        raise LayerwatchError(f"LAYERWATCH_SPILL={mode!r}: expected auto, always or never")
    return mode


def spill_dir(report: str | None) -> Path:
    """Where a spilled store's files go: ``LAYERWATCH_SPILL_DIR``, else beside the report,
    else the temporary directory (``TMPDIR``)."""
    chosen = os.environ.get("LAYERWATCH_SPILL_DIR")
    if chosen:
        return Path(chosen)
    if report and report != "-":
        return Path(report).resolve().parent
    return Path(tempfile.gettempdir())


def live_spill(report: str | None) -> Path | None:
    """Where a live session (``open``, ``watch``, ``run``, the TUI) spills its settled pairs'
    store, None to keep it in RAM (``LAYERWATCH_SPILL=never``). A live run's size is not known
    while it is written, so it spills unless told not to: only full chunks (65 536 pairs) are
    written, so a small session writes nothing, and a long one keeps a few bytes a pair."""
    return None if spill_mode() == "never" else spill_dir(report)


@dataclass(frozen=True, slots=True)
class Estimate:
    pairs: int
    tokens: int
    windowed: bool
    spill: Path | None = None
    """Where the store's full chunks go (a windowed compare that would not fit in RAM)."""

    @property
    def per_pair(self) -> int:
        if not self.windowed:
            return SESSION_BYTES
        return STORE_BYTES

    @property
    def nbytes(self) -> int:
        if self.spill is not None:
            fixed = self.tokens * TOKEN_BYTES + WINDOW_BYTES + SPILL_RAM
            return self.pairs * SPILLED_BYTES + fixed
        return self.pairs * self.per_pair + (WINDOW_BYTES if self.windowed else 0)

    @property
    def disk_bytes(self) -> int:
        return self.pairs * DISK_BYTES if self.spill is not None else 0

    def tokens_that_fit(self, budget: int) -> int:
        """How many tokens (of about equal size) fit in ``budget`` bytes."""
        if not self.tokens or not self.pairs:
            return 0
        per_token = self.pairs / self.tokens * self.per_pair
        room = budget - (WINDOW_BYTES if self.windowed else 0)
        return max(0, int(room // per_token))


def _gb(n: float) -> str:
    return f"{n / 2**30:.1f} GB" if n >= 2**30 else f"{n / 2**20:.0f} MB"


def check(estimate: Estimate, limit: int | None, spill: Path | None = None) -> Estimate:
    """The estimate to run with: ``estimate`` when it fits in ``limit`` bytes (default: the
    free memory), else, for a windowed compare given a ``spill`` directory, the same spilled
    to it when that fits in memory and on its disk; else the one-line LayerwatchError."""
    budget = limit if limit is not None else available()
    mode = spill_mode() if estimate.windowed and spill is not None else "never"
    fits = budget is None or estimate.nbytes <= budget
    if mode == "never" or (fits and mode == "auto"):
        if fits:
            return estimate
        _refuse(estimate, budget, limit)
    spilled = replace(estimate, spill=spill)
    if budget is not None and spilled.nbytes > budget:
        _refuse(estimate, budget, limit)
    free = _disk_free(spill)
    if free is not None and spilled.disk_bytes > free:
        _refuse(estimate, budget, limit, disk=(spilled.disk_bytes, free, spill))
    return spilled


def _disk_free(directory: Path | None) -> int | None:
    try:
        return shutil.disk_usage(directory).free if directory is not None else None
    except OSError:
        return None


def _refuse(
    estimate: Estimate,
    budget: int | None,
    limit: int | None,
    disk: tuple[int, int, Path | None] | None = None,
) -> None:
    budget = budget if budget is not None else 0
    fit = estimate.tokens_that_fit(budget)
    if fit:
        hint = f"--tokens 0-{fit - 1} fits, or --nodes GLOB for fewer nodes"
    else:
        hint = "not even one token fits: --nodes GLOB for fewer nodes (and --tokens)"
    pairs = f"{estimate.pairs:,}".replace(",", " ")
    allowed = "is allowed (--max-memory)" if limit is not None else "is free"
    spilled = ""
    if disk is not None:
        need, free, where = disk
        spilled = f"; spilled to disk they need about {_gb(need)} and {where} has {_gb(free)}"
    raise LayerwatchError(
        f"about {pairs} pairs need about {_gb(estimate.nbytes)} of memory and "
        f"{_gb(budget)} {allowed}{spilled}: {hint}"
    )
