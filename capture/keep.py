"""Statistics-first capture (``DumpConfig(keep_tokens=N)``, ``layerwatch dump --stats-first``).

Every tensor's statistics stay in the index; payloads stay on disk only for the last ``N``
tokens and for the tokens around an anomaly (a token with a NaN, an Inf or a value at its
dtype's finite maximum, and its neighbours), so a 4k-token run keeps what a person will drill
into. Only outputs are judged (an attention mask input holds ``finfo.min`` by design). Data files hold whole batches, possibly of several tokens: a file is deleted once every
token in it has left the ring and none is kept, and a ``{"k":"drop","file":...}`` index line
says so — readers then treat that file's tensors as statistics-only (the index never changes
what it already said, it only adds).
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path
from typing import Any

FINITE_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38}
"""fp16/bf16 finite maxima (a value there is saturated): the engine's anomaly checks use the
same numbers (engine/numerics/anomaly.py); capture cannot import the engine."""
AROUND = 1
"""Tokens kept on each side of an anomalous one."""


def anomalous(stats: tuple[float, ...] | None, dtype: str) -> bool:
    """NaN/Inf counted, or a finite maximum at the dtype's largest value (``stats`` = max, min,
    mean, norm, nan, inf as ``capture/stats.py`` computes them; the negative end is where
    transformers puts ``finfo.min`` to mask attention, so it is not judged)."""
    if stats is None:
        return False
    high, _low, _mean, _norm, nan, inf = stats
    if nan or inf:
        return True
    top = FINITE_MAX.get(dtype)
    return top is not None and not math.isnan(high) and high >= top  # finfo.min marks masking


class TokenRing:
    """Which data files may go: the writer tells it what each file holds and which tokens
    were anomalous; :meth:`expired` names the files to delete."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.files: dict[str, set[int]] = {}
        """Data file (relative name) → tokens with payloads in it."""
        self.kept: set[int] = set()
        """Tokens kept whatever their age (an anomaly and its neighbours)."""
        self.latest = -1

    def wrote(self, rel: str, tokens: set[int]) -> None:
        if tokens:
            self.files.setdefault(rel, set()).update(tokens)
            self.latest = max(self.latest, *tokens)

    def anomaly(self, token: int) -> None:
        self.kept.update(range(token - AROUND, token + AROUND + 1))

    def started(self, token: int) -> None:
        self.latest = max(self.latest, token)

    def expired(self) -> list[str]:
        """Files whose every token is older than the last ``keep`` and none is kept; forgotten."""
        oldest_kept = self.latest - self.keep + 1
        gone = [
            rel
            for rel, tokens in self.files.items()
            if max(tokens) < oldest_kept and not tokens & self.kept
        ]
        for rel in gone:
            del self.files[rel]
        return gone

    def state(self) -> dict[str, Any]:
        """The ring as JSON: it crosses to the writer process at the hand-over
        (capture/writer_process.py)."""
        files = {rel: sorted(tokens) for rel, tokens in self.files.items()}
        return {"keep": self.keep, "files": files, "kept": sorted(self.kept), "latest": self.latest}

    @classmethod
    def of_state(cls, state: dict[str, Any]) -> TokenRing:
        """The ring :meth:`state` described."""
        ring = cls(state["keep"])
        ring.files = {rel: set(tokens) for rel, tokens in state["files"].items()}
        ring.kept = set(state["kept"])
        ring.latest = state["latest"]
        return ring


def remove(run_dir: Path, rel: str) -> None:
    """Delete one data file (already gone is fine: the drop line still says so)."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(run_dir / rel)
