"""The records of a scan: one anomalous output (``ScanRow``) and the whole result (``ScanReport``),
with the JSON shape every headless command shares (``summary``, ``first_failure``, ``rows``).
The scan itself is engine/scan.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from layerwatch.engine.numerics import anomaly
from layerwatch.engine.records import Stats, TensorKey

APPEARS = "appears"
INSIDE = "inside"
PROPAGATED = "propagated"


@dataclass(frozen=True, slots=True)
class ScanRow:
    """One anomalous output tensor."""

    key: TensorKey
    kinds: tuple[str, ...]
    status: str
    dtype: str
    shape: tuple[int, ...]
    stats: Stats
    order: int
    ratio: float | None = None
    """Output magnitude over the largest input magnitude (``None``: no floating input)."""
    source: str = ""
    earlier: int | None = None
    """The first token of this rank that was already anomalous, when before this row's token:
    a cache (KV) can carry an anomaly into a later token with clean inputs."""

    @property
    def anomaly(self) -> str:
        return self.kinds[0]

    def reason(self) -> str:
        s = self.stats
        bits = []
        if s.nan:
            bits.append(f"{s.nan} NaN")
        if s.inf:
            bits.append(f"{s.inf} Inf")
        if s.max == s.max:  # not NaN: some element is finite
            bits.append(f"max {s.max:.6g}, min {s.min:.6g}")
        else:
            bits.append("no finite value")
        if self.ratio is not None and anomaly.JUMP in self.kinds:
            bits.append(f"{self.ratio:.3g}× its inputs' magnitude")
        how = {
            APPEARS: "appears here (inputs clean)",
            INSIDE: "appears in a nested node",
            PROPAGATED: "carried in by an input",
        }
        text = f"{'+'.join(self.kinds)} {how[self.status]}: {', '.join(bits)}"
        if self.earlier is not None and self.status != PROPAGATED:
            text += f" (token {self.earlier} was already anomalous: a cache may carry it)"
        return text

    def to_json(self, with_rank: bool = False) -> dict[str, Any]:
        row: dict[str, Any] = {"token": self.key.token, "node": self.key.node}
        if with_rank:
            row["rank"] = self.key.rank
        row.update(
            tensor=self.key.stem,
            anomaly=self.anomaly,
            kinds=list(self.kinds),
            status=self.status,
            order=self.order,
            dtype=self.dtype,
            shape=list(self.shape),
            stats={
                "max": self.stats.max,
                "min": self.stats.min,
                "mean": self.stats.mean,
                "norm": self.stats.norm,
                "nan": self.stats.nan,
                "inf": self.stats.inf,
            },
            ratio=self.ratio,
            reason=self.reason(),
        )
        return row


@dataclass(slots=True)
class ScanReport:
    rows: list[ScanRow] = field(default_factory=list)
    tensors: int = 0
    """Output tensors judged."""
    nodes: int = 0
    """(token, node) calls seen."""
    tokens: int = 0
    ranks: int = 1
    loaded: int = 0
    """Payloads read because the dump carried no statistics for them."""
    bounds: anomaly.Bounds = field(default_factory=anomaly.Bounds)
    peak_ratio: tuple[float, TensorKey] | None = None
    """The largest output/input magnitude ratio seen (clean or not): the jump rule's headroom."""
    peak_magnitude: tuple[float, TensorKey] | None = None
    """The largest finite output magnitude seen."""
    notes: list[str] = field(default_factory=list)

    @property
    def first_failure(self) -> ScanRow | None:
        """The first row in execution order where an anomaly appears, else the first row."""
        born = [r for r in self.rows if r.status == APPEARS] or self.rows
        return min(born, key=position, default=None)

    def sorted_rows(self) -> list[ScanRow]:
        return sorted(self.rows, key=position)

    def to_json(self) -> dict[str, Any]:
        multi = self.ranks > 1
        first = self.first_failure
        by_kind = {k: sum(1 for r in self.rows if k in r.kinds) for k in anomaly.KINDS}
        return {
            "summary": {
                "tensors": self.tensors,
                "nodes": self.nodes,
                "tokens": self.tokens,
                "ranks": self.ranks,
                "anomalous": len(self.rows),
                "appears": sum(1 for r in self.rows if r.status == APPEARS),
                "by_kind": by_kind,
                "payloads_read": self.loaded,
                "peak_ratio": _peak(self.peak_ratio),
                "peak_magnitude": _peak(self.peak_magnitude),
                "jump_ratio": self.bounds.ratio,
                "jump_floor": self.bounds.floor,
                "notes": list(self.notes),
            },
            "first_failure": None if first is None else first.to_json(with_rank=multi),
            "rows": [r.to_json(with_rank=multi) for r in self.sorted_rows()],
        }


def position(row: ScanRow) -> tuple[int, int, int, str, str]:
    return (row.key.token, row.key.rank, row.order, row.key.node, row.key.stem)


def _peak(peak: tuple[float, TensorKey] | None) -> dict[str, Any] | None:
    if peak is None:
        return None
    value, key = peak
    return {"value": value, "token": key.token, "node": key.node, "tensor": key.stem}
