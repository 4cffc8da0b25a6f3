"""The layerwatch dump format: names, layout and index records shared by writer and readers.

Plain Python and JSON only (no torch, no numpy) so the engine, the watchers and the CLI can
import it cheaply. The writer lives in ``capture/writer.py``; the reader in
``engine/readers/layerwatch.py``. ARCHITECTURE.md documents the format for humans.

Layout of one run (one side: golden or target)::

    {dump_path}/
      {device}_{pid}/              one directory per process ("rank"), named like msit's
        manifest.json              written atomically at start and at the end (status)
        index.jsonl                append-only; one JSON object per line; only complete lines count
        topology.json              written atomically whenever the module tree/order is known
        data/{seq:08d}.safetensors batches of tensors, each written to a temp name and renamed

An index line is written only after the file it points at has been renamed into place, with a
single ``write()`` per batch, so a reader that consumes complete lines never sees a tensor whose
bytes are not on disk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .atomic import TMP_PREFIX as TMP_PREFIX  # files being written; watchers and readers skip them
from .atomic import replacing

FORMAT_NAME = "layerwatch"
FORMAT_VERSION = 1

MANIFEST = "manifest.json"
INDEX = "index.jsonl"
TOPOLOGY = "topology.json"
DATA_DIR = "data"

# Index record kinds (the "k" field of an index line).
K_TENSOR = "t"
"""A tensor that landed: key, dtype, shape, file, byte offsets, statistics."""
K_TOKEN = "token"
"""A root forward call started: token number and the input ids the root received."""
K_END = "end"
"""The writer stopped: ``status`` is ``complete`` or says why it stopped."""
K_ERROR = "error"
"""Capture hit a problem it could not recover from (disk full...): ``message``."""
K_DROP = "drop"
"""Statistics-first capture deleted a data file (``file``): its tensors are statistics-only
from now on (``capture/keep.py``)."""
K_WEIGHT = "weight"
"""A parameter dumped once (``dump_weight``): ``name`` (``root.<module>.<param>``), ``node``,
``param``, ``dtype``, ``shape``, ``file``, ``begin``, ``end`` (same meaning as for tensors)."""

K_FOLLOW = "follow"
"""Teacher forcing (``DumpConfig.follow``): at ``token`` the target's own choice ``own_id``
(argmax of its last-position logits, one per batch row) and ``fed_id``, the golden's next token
that the returned logits forced instead. Readers that do not know the kind skip it."""

K_CASE = "case"
"""Per-case capture: case ``key`` starts at ``token`` (``capture/cases.py``)."""
K_CASE_END = "case_end"
"""Case ``key`` ends before ``token``. Without one, a case ends where the next one begins."""

K_COLLECTIVE = "collective"
"""A ``torch.distributed`` collective captured as node ``node`` (``capture/collectives.py``):
``type`` (one of ``COLLECTIVE_TYPES``), ``op`` (``SUM``/``MAX``/``MIN``/``AVG``/``PRODUCT``,
``GATHER``, ``SRC{r}``), ``world_size``, ``rank``."""
COLLECTIVE_TYPES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "broadcast",
    "all_gather_single",  # torch 2.13's names of the two ``*_tensor`` ones
    "reduce_scatter_single",
)
"""Node types of captured collectives: the ``torch.distributed`` function names."""
REDUCTION_TYPES = ("all_reduce", "reduce_scatter_tensor", "reduce_scatter_single")
"""Collectives whose input on a rank is a partial sum."""

STATUS_RUNNING = "running"
STATUS_COMPLETE = "complete"


def rank_dir_name(device: str, pid: int) -> str:
    """``cpu_1234`` / ``cuda0_1234`` / ``npu3_1234``: the msit rank directory naming."""
    return f"{device.replace(':', '')}_{pid}"


def data_file_name(seq: int) -> str:
    return f"{DATA_DIR}/{seq:08d}.safetensors"


def tensor_name(token: int, node: str, stem: str) -> str:
    """Name of a tensor inside a safetensors batch file."""
    return f"{token}/{node}/{stem}"


@dataclass(frozen=True, slots=True)
class IndexTensor:
    """One ``K_TENSOR`` index line, decoded.

    ``file`` is relative to the rank directory; ``begin``/``end`` are absolute byte offsets of
    the raw little-endian C-contiguous payload inside that file, so a reader can load it with
    one ``np.fromfile`` and never parse the safetensors header. ``file`` is ``""`` for a
    statistics-only record.
    """

    token: int
    node: str
    stem: str
    dtype: str
    shape: tuple[int, ...]
    file: str
    begin: int
    end: int
    order: int
    """Completion order of ``node`` at ``token`` (0 = first node to finish)."""
    node_type: str
    stats: dict[str, float] | None
    """``max min mean norm`` over the finite elements, ``nan``/``inf`` counts; ``None`` if absent."""

    def to_json(self) -> dict[str, Any]:
        return {
            "k": K_TENSOR,
            "token": self.token,
            "node": self.node,
            "stem": self.stem,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "file": self.file,
            "begin": self.begin,
            "end": self.end,
            "order": self.order,
            "type": self.node_type,
            "stats": self.stats,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> IndexTensor:
        return cls(
            token=int(obj["token"]),
            node=str(obj["node"]),
            stem=str(obj["stem"]),
            dtype=str(obj["dtype"]),
            shape=tuple(int(d) for d in obj["shape"]),
            file=str(obj.get("file", "")),
            begin=int(obj.get("begin", 0)),
            end=int(obj.get("end", 0)),
            order=int(obj.get("order", -1)),
            node_type=str(obj.get("type", "")),
            stats=obj.get("stats"),
        )


def encode_line(obj: dict[str, Any]) -> str:
    """One index line. NaN/Inf statistics are written as strings to keep the JSON strict."""
    return json.dumps(_strict(obj), separators=(",", ":"), allow_nan=False) + "\n"


def _strict(value: Any) -> Any:
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return repr(value)  # 'nan', 'inf', '-inf'
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(v) for v in value]
    return value


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON to ``path`` through a temp file and a rename, so readers never see half of it."""
    with replacing(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        json.dump(_strict(obj), fh, indent=1, allow_nan=False)
