"""format="msit": msit's directory layout, files that load with torch.load(weights_only=True)."""

from __future__ import annotations

import csv
import json
import os
import re

import torch
from layerwatch.capture import DumpConfig, register_hook
from torch import nn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.act = nn.SiLU()

    def forward(self, x):
        return self.act(self.proj(x)), x[:, :2]  # a tuple output with a view


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.layers = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(8, 20)

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x, _ = layer(x)
        return self.head(x)


def test_layout_model_tree_weights_and_safe_loading(tmp_path):
    torch.manual_seed(0)
    toy = Toy()
    ids = [torch.tensor([[1, 2, 3]]), torch.tensor([[4]])]
    with register_hook(
        toy, DumpConfig(dump_path=tmp_path, format="msit", dump_weight=True)
    ) as handle:
        outs = [toy(x) for x in ids]
    run = handle.run_dir
    assert re.fullmatch(r"msit_dump_\d{8}_\d{6}", run.parents[1].name)
    assert run.parent.name == "torch_tensors" and run.name == f"cpu_{os.getpid()}"
    tree = json.loads((run / "model_tree.json").read_text())
    assert tree["name"] == "root" and tree["type"] == "Toy"
    assert [c["name"] for c in tree["children"]] == ["root.embed", "root.layers", "root.head"]
    layer0 = tree["children"][1]["children"][0]
    assert layer0 == {
        "name": "root.layers.0",
        "type": "Block",
        "children": [
            {"name": "root.layers.0.proj", "type": "Linear", "children": []},
            {"name": "root.layers.0.act", "type": "SiLU", "children": []},
        ],
    }
    assert sorted(p.name for p in run.iterdir()) == ["0", "1", "model_tree.json", "weights"]
    files = {p.name for p in (run / "0" / "root.layers.1").iterdir()}
    assert files == {"input_0.pth", "output_0.pth", "output_1.pth"}
    for token, out in enumerate(outs):
        head = torch.load(run / str(token) / "root.head" / "output.pth", weights_only=True)
        assert torch.equal(head, out)
        assert torch.equal(
            torch.load(run / str(token) / "root.embed" / "input_0.pth", weights_only=True),
            ids[token],
        )
    view = torch.load(run / "0" / "root.layers.0" / "output_1.pth", weights_only=True)
    assert view.untyped_storage().nbytes() == view.numel() * 4  # not the whole storage
    weight = torch.load(run / "weights" / "root.layers.1.proj.weight.pth", weights_only=True)
    assert torch.equal(weight, toy.layers[1].proj.weight.detach())
    for path in run.rglob("*.pth"):
        torch.load(path, weights_only=True)
    assert not list(run.rglob(".tmp-*"))


def test_statistics_csv_in_msit_columns(tmp_path):
    torch.manual_seed(0)
    toy = Toy()
    with register_hook(
        toy, DumpConfig(dump_path=tmp_path, format="msit", dump_statistics_mode=1)
    ) as handle:
        out = toy(torch.tensor([[1, 2]])).detach()
    run = handle.run_dir
    assert not list(run.rglob("*.pth"))
    rows = list(csv.DictReader((run / "0" / "root.head" / "statistics.csv").open()))
    assert [r["InputOutput"] for r in rows] == ["Input", "Output"]
    out_row = rows[1]
    assert out_row["NodeName"] == "root.head" and out_row["NodeType"] == "Linear"
    assert out_row["DataType"] == "torch.float32" and out_row["Shape"] == "[1, 2, 20]"
    assert float(out_row["Max"]) == float(out.max())
    assert abs(float(out_row["L2Norm"]) - float(out.norm())) < 1e-5
