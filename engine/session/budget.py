"""Will a compare fit in memory? Estimated from the index before anything is compared.

A compare that does not fit must end in one line naming the filters that make it fit, not in a
process the kernel kills an hour in. Bytes a pair are this repository's measured figures
(tests/bench/bench_scale.py) rounded up: a windowed compare (engine/session/windowed.py) keeps
``STORE_BYTES`` a pair plus one window, a whole-run session ``SESSION_BYTES`` a pair.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from layerwatch.capture.errors import LayerwatchError

STORE_BYTES = 256
"""A pair in the result store, with room to spare (measured ~170)."""
SESSION_BYTES = 6_000
"""A pair held by a whole-run CompareSession: both records, raw and reported result (~5.4 KB)."""
WINDOW_BYTES = 160 << 20
"""One window's records and results while it is compared, and the interpreter's own growth."""
HELD_BYTES = 3_000
"""A pair of a dump read whole before its windows (msprobe: both records, held until their
window; measured ~2.4 KB, tests/engine/session/test_scale_formats.py)."""

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


@dataclass(frozen=True, slots=True)
class Estimate:
    pairs: int
    tokens: int
    windowed: bool
    held: bool = False
    """The records were read whole and wait for their window (a pair costs ``HELD_BYTES`` more)."""

    @property
    def per_pair(self) -> int:
        if not self.windowed:
            return SESSION_BYTES
        return STORE_BYTES + (HELD_BYTES if self.held else 0)

    @property
    def nbytes(self) -> int:
        return self.pairs * self.per_pair + (WINDOW_BYTES if self.windowed else 0)

    def tokens_that_fit(self, budget: int) -> int:
        """How many tokens (of about equal size) fit in ``budget`` bytes."""
        if not self.tokens or not self.pairs:
            return 0
        per_token = self.pairs / self.tokens * self.per_pair
        room = budget - (WINDOW_BYTES if self.windowed else 0)
        return max(0, int(room // per_token))


def _gb(n: float) -> str:
    return f"{n / 2**30:.1f} GB" if n >= 2**30 else f"{n / 2**20:.0f} MB"


def check(estimate: Estimate, limit: int | None) -> None:
    """Raise the one-line LayerwatchError when ``estimate`` exceeds ``limit`` bytes (default:
    the free memory)."""
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
