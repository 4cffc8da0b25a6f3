"""``format="msit"``: msit's torch dump layout, so ``msit llm compare`` can read our dumps.

Layout (msit's)::

    {dump_path}/msit_dump_{YYYYMMDD_HHMMSS}/torch_tensors/{device}_{pid}/
      model_tree.json                         nested {"name", "type", "children"}
      weights/root.{module}.{param}.pth       with dump_weight
      {token}/{node}/{stem}.pth               one tensor per file: output.pth, input_0.pth...
      {token}/{node}/statistics.csv           with dump_statistics_mode 1 or 2

Unlike msit, every ``.pth`` holds a contiguous copy (never a view's whole storage), loads with
``torch.load(weights_only=True)``, and is written by the writer thread as a temp file renamed
into place. A tensor captured twice unmodified (an output that is the next module's input) is
hard-linked rather than saved again.
"""

from __future__ import annotations

import csv
import io
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .atomic import replacing, write_text
from .config import DumpConfig
from .errors import LayerwatchError
from .format import write_json_atomic
from .handoff import Placeholder, TensorItem, TokenItem, TopologyItem, WeightItem
from .safetensors_file import dtype_name
from .stats import as_torch, batch_stats
from .topology import model_tree
from .writer_thread import WriterThread

STAT_COLUMNS = (
    "NodeName",
    "NodeType",
    "InputOutput",
    "Index",
    "DataType",
    "Shape",
    "Max",
    "Min",
    "Mean",
    "L2Norm",
)


def msit_run_dir(dump_path: Path, device: str, pid: int) -> Path:
    stamp = time.strftime("%Y%m%d_%H%M%S")
    return dump_path / f"msit_dump_{stamp}" / "torch_tensors" / f"{device}_{pid}"


class MsitWriter(WriterThread):
    """Writes one ``.pth`` per tensor in msit's directory layout."""

    def __init__(self, config: DumpConfig, run_dir: Path, model: torch.nn.Module) -> None:
        super().__init__(config, run_dir)
        self.want_payload = config.want_payload
        self.want_stats = config.want_stats
        self._dirs: set[Path] = set()
        self._stat_rows: dict[Path, list[list[str]]] = {}
        self.deferred: list[TensorItem] = []
        try:
            if (run_dir / "model_tree.json").exists():
                raise LayerwatchError(
                    f"{run_dir} already holds a dump of this process: give each model its own dump_path"
                )
            run_dir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(run_dir / "model_tree.json", model_tree(model))
        except OSError as exc:
            raise LayerwatchError(
                f"cannot write a dump in {run_dir}: {exc.strerror or exc}"
            ) from None

    def write_items(self, items: list[Any]) -> None:
        fresh = [it for it in items if type(it) is TensorItem and it.alias is None]
        for it in fresh:
            it.dtype_name = str(it.dtype)
            it.shape = list(it.tensor.shape)
        real = [
            it
            for it in fresh
            if isinstance(it.tensor, np.ndarray)
            or (
                type(it.tensor) is not Placeholder
                and not it.tensor.is_complex()
                and it.tensor.layout is torch.strided
                and it.tensor.device.type != "meta"
            )
        ]
        if self.want_stats and real:
            rows = batch_stats([it.tensor for it in real], [dtype_name(it.dtype) for it in real])
            for it, row in zip(real, rows, strict=True):
                it.stats = row
        touched: set[Path] = set()
        for it in items:
            kind = type(it)
            if kind is TensorItem:
                if it.alias is not None and not it.alias.done:
                    self.deferred.append(it)  # the original is queued later (outer module input)
                else:
                    self._tensor(it, touched)
                    if self.deferred and it.alias is None:
                        self._resolve(touched)
            elif kind is WeightItem:
                self._save(it, self.run_dir / "weights" / f"{it.node}.{it.param}.pth")
            elif kind is TokenItem:
                for folder in touched:
                    self._write_stats(folder)
                touched.clear()
                self._stat_rows.clear()  # a node's rows all arrive within its token
                self.deferred = [d for d in self.deferred if d.token >= it.token]
                self.tokens_seen = max(self.tokens_seen, it.token + 1)
            elif kind is TopologyItem:
                pass  # msit's model_tree.json has no execution order
        for folder in touched:
            self._write_stats(folder)

    def _tensor(self, it: TensorItem, touched: set[Path]) -> None:
        folder = self.run_dir / str(it.token) / it.node
        if self.want_payload:
            self._save(it, folder / f"{it.stem}.pth")
        if self.want_stats:
            self._stat_row(it, folder)
            touched.add(folder)
        it.done = True

    def _resolve(self, touched: set[Path]) -> None:
        ready = [d for d in self.deferred if d.alias is not None and d.alias.done]
        if ready:
            self.deferred = [d for d in self.deferred if d.alias is None or not d.alias.done]
            for it in ready:
                self._tensor(it, touched)

    def _save(self, it: Any, path: Path) -> None:
        folder = path.parent
        if folder not in self._dirs:
            folder.mkdir(parents=True, exist_ok=True)
            self._dirs.add(folder)
        source = it.alias if type(it) is TensorItem and it.alias is not None else None
        if source is not None and not source.file:
            return  # its original was not saved
        if source is None and (it.tensor is None or type(it.tensor) is Placeholder):
            return  # nothing to save (a sparse tensor)
        with replacing(path) as tmp:
            if source is not None:
                try:
                    os.link(source.file, tmp)
                except OSError:
                    tmp.write_bytes(Path(source.file).read_bytes())
            else:
                data = it.tensor if type(it) is WeightItem else as_torch(it.tensor, it.dtype)
                torch.save(data, tmp)
        it.file = str(path)
        if source is None:
            self.tensors_written += 1
            self.bytes_written += it.nbytes

    def _stat_row(self, it: TensorItem, folder: Path) -> None:
        src = it.alias if it.alias is not None else it
        if src.stats is None:
            return
        part, _, index = it.stem.partition("_")
        mx, mn, mean, norm, _nan, _inf = src.stats
        self._stat_rows.setdefault(folder, []).append(
            [
                it.node,
                it.node_type,
                part.capitalize(),
                index or "0",
                src.dtype_name or "",
                str(src.shape),
                repr(mx),
                repr(mn),
                repr(mean),
                repr(norm),
            ]
        )

    def _write_stats(self, folder: Path) -> None:
        if folder not in self._dirs:
            folder.mkdir(parents=True, exist_ok=True)
            self._dirs.add(folder)
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(STAT_COLUMNS)
        writer.writerows(self._stat_rows[folder])
        write_text(folder / "statistics.csv", buf.getvalue())
