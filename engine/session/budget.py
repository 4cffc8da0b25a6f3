"""Will a compare fit in memory? Estimated from the index before anything is compared.

A compare that does not fit must end in one line naming the filters that make it fit, not in a
process the kernel kills an hour in. Bytes are this repository's measured figures
(tests/bench/bench_scale.py) rounded up: a windowed compare (engine/session/windowed.py) keeps
one window, ``TOKEN_BYTES`` a token and ``PAIR_BYTES`` a pair when both layerwatch indexes were
folded per token as they were scanned (engine/readers/index_columns.py ``scan_file``), else
``ROW_PAIR_BYTES`` (an index kept a row a tensor line; other formats' windows) — never a result:
its pairs are in the report once judged; a whole-run session ``SESSION_BYTES`` a pair.

The live session (``open``, ``watch``, ``run``, the TUI) keeps every settled pair in a result
store that spills its full chunks to disk (engine/session/settled.py, :func:`live_spill`);
``LAYERWATCH_SPILL=always|never`` and ``LAYERWATCH_SPILL_DIR`` are read for it.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from layerwatch.capture.errors import LayerwatchError

PAIR_BYTES = 16
"""A pair in a windowed compare of two layerwatch indexes in token order, folded per token: no
array a tensor line (peak RSS grew ~3 B a pair from 100 k to 1 M pairs and ~4.7 B from 1 M to
4 M, the tokens' tables included: README), with room to spare."""
ROW_PAIR_BYTES = 128
"""A pair in a windowed compare whose index is kept a row a tensor line (out of token order:
24 B a line a side, engine/readers/index_columns.py, and the copy that joins its blocks; peak
RSS grew ~84 B a pair so), and in msit, ATB and msprobe windows."""
SESSION_BYTES = 6_000
"""A pair held by a whole-run CompareSession: both records, raw and reported result (~5.4 KB)."""
WINDOW_BYTES = 160 << 20
"""One window's records and results while it is compared, and the interpreter's own growth;
also the next window's records, read meanwhile when forked children compare this one
(engine/session/windowed.py): peak RSS at 1 M small pairs 78 MB with it against 74 MB
for the build before it (bench_scale, one run each at load ~1). A next window compared there
too (one small enough to stay in this process) is one whose tensors and this window's are
together no more than one window may hold."""
TOKEN_BYTES = 2_048
"""A token in a windowed compare: its input ids, its data files' paths."""

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
    """``auto`` or ``always`` (a live session spills), ``never`` (it keeps its store in RAM)."""
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
    folded: bool = False
    """Both indexes kept per token, not a row a tensor line (``IndexScan.rows`` 0)."""

    @property
    def per_pair(self) -> int:
        if not self.windowed:
            return SESSION_BYTES
        return PAIR_BYTES if self.folded else ROW_PAIR_BYTES

    @property
    def per_token(self) -> float:
        """Bytes a token adds: its pairs, and a windowed compare's token tables."""
        pairs = self.pairs / self.tokens if self.tokens else 0
        return pairs * self.per_pair + (TOKEN_BYTES if self.windowed else 0)

    @property
    def nbytes(self) -> int:
        if not self.windowed:
            return self.pairs * SESSION_BYTES
        return self.pairs * self.per_pair + self.tokens * TOKEN_BYTES + WINDOW_BYTES

    def tokens_that_fit(self, budget: int) -> int:
        """How many tokens (of about equal size) fit in ``budget`` bytes."""
        if not self.tokens or not self.pairs:
            return 0
        room = budget - (WINDOW_BYTES if self.windowed else 0)
        return max(0, int(room // self.per_token))


def _gb(n: float) -> str:
    return f"{n / 2**30:.1f} GB" if n >= 2**30 else f"{n / 2**20:.0f} MB"


def check(estimate: Estimate, limit: int | None) -> None:
    """Nothing when ``estimate`` fits in ``limit`` bytes (default: the free memory), else the
    one-line LayerwatchError naming the filters that make it fit."""
    budget = limit if limit is not None else available()
    if budget is None or estimate.nbytes <= budget:
        return
    fit = estimate.tokens_that_fit(budget)
    if fit:
        hint = f"--tokens 0-{fit - 1} fits, or --nodes GLOB for fewer nodes"
    else:
        hint = "not even one token fits: --nodes GLOB for fewer nodes (and --tokens)"
    pairs = f"{estimate.pairs:,}".replace(",", " ")
    allowed = "is allowed (--max-memory)" if limit is not None else "is free"
    raise LayerwatchError(
        f"about {pairs} pairs need about {_gb(estimate.nbytes)} of memory and "
        f"{_gb(budget)} {allowed}: {hint}"
    )
