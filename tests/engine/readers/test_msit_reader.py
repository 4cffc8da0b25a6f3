"""msit torch dumps (fixtures written by msit 8.2.0): keys, values, order, token ids, live reading."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from layerwatch.engine.readers import open_dump
from layerwatch.engine.readers.load import load_array

from .conftest import FIXTURES

GOLDEN = FIXTURES / "msit" / "golden" / "msit_dump_fixture"
TARGET = FIXTURES / "msit" / "target" / "msit_dump_fixture"
STATS = FIXTURES / "msit" / "stats" / "msit_dump_fixture"
RANK = GOLDEN / "torch_tensors" / "cpu_1000"
IDS = {0: (11, 42, 7, 93), 1: (92,), 2: (63,)}


def _torch(path: str) -> np.ndarray:
    t = torch.load(path, weights_only=True).detach()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def test_golden_fixture_keys_values_and_token_ids() -> None:
    update = open_dump(GOLDEN).poll()
    assert update.notes == []
    assert update.token_ids == IDS
    files = sorted(str(p) for p in RANK.glob("[0-9]*/*/*.pth"))
    assert sorted(r.source for r in update.tensors) == files
    for record in update.tensors:
        token, node, name = Path(record.source).parts[-3:]
        assert (record.key.token, record.key.node, record.key.stem) == (int(token), node, name[:-4])
        expected = _torch(record.source)
        got = load_array(record.loc)
        assert got.shape == expected.shape == record.shape
        np.testing.assert_array_equal(got, expected)
    types = {r.key.node: r.node_type for r in update.tensors}
    assert types["root.model.layers.0.mlp.down_proj"] == "Linear"
    assert types["root.model.layers.1"] == "LlamaDecoderLayer"
    assert {
        r.dtype for r in update.tensors if r.key.stem == "input_0" and "embed" in r.key.node
    } == {"int64"}


def test_execution_order_inner_before_outer() -> None:
    update = open_dump(GOLDEN).poll()
    for token in IDS:
        order = {r.key.node: r.order for r in update.tensors if r.key.token == token}
        assert sorted(order.values()) == list(range(len(order)))  # dense per token
        chain = [
            "root.model.embed_tokens",
            "root.model.layers.0.input_layernorm",
            "root.model.layers.0.self_attn.q_proj",
            "root.model.layers.0.self_attn",
            "root.model.layers.0.mlp.down_proj",
            "root.model.layers.0.mlp",
            "root.model.layers.0",
            "root.model.layers.1.mlp.down_proj",
            "root.model.layers.1",
            "root.model.norm",
            "root.lm_head",
        ]
        assert [order[n] for n in chain] == sorted(order[n] for n in chain)
    topo = update.topology
    assert (
        topo is not None and topo.nodes["root.model.layers.1.mlp"].parent == "root.model.layers.1"
    )
    assert (
        topo.nodes["root.model.layers.0.mlp.down_proj"].order
        < topo.nodes["root.model.layers.0"].order
    )


def test_weights_and_every_accepted_directory() -> None:
    update = open_dump(RANK).poll()
    assert len(update.weights) == 21
    w = update.weights["root.model.layers.1.mlp.down_proj.weight"]
    np.testing.assert_array_equal(
        load_array(w),
        _torch(str(RANK / "weights" / "root.model.layers.1.mlp.down_proj.weight.pth")),
    )
    n_all = len(update.tensors)
    assert len(open_dump(GOLDEN / "torch_tensors").poll().tensors) == n_all
    only_1 = open_dump(RANK / "1").poll()
    assert {r.key.token for r in only_1.tensors} == {1} and only_1.token_ids == {1: IDS[1]}


def test_target_pairs_with_golden_and_differs_at_the_fault() -> None:
    golden = {r.key: r for r in open_dump(GOLDEN).poll().tensors}
    target = {r.key: r for r in open_dump(TARGET).poll().tensors}
    assert set(golden) == set(target)
    key = next(
        k for k in golden if k.node == "root.model.layers.1.mlp.down_proj" and k.stem == "output"
    )
    assert not np.array_equal(load_array(golden[key].loc), load_array(target[key].loc))
    before = next(
        k for k in golden if k.node == "root.model.layers.1.mlp.down_proj" and k.stem == "input_0"
    )
    np.testing.assert_array_equal(load_array(golden[before].loc), load_array(target[before].loc))


def test_statistics_only_dump() -> None:
    update = open_dump(STATS).poll()
    assert update.tensors and all(r.loc is None and r.stats is not None for r in update.tensors)
    by_key = {(r.key.token, r.key.node, r.key.stem): r for r in update.tensors}
    attn = by_key[(0, "root.model.layers.0.self_attn", "output_1")]
    assert attn.shape == (1, 4, 4, 4) and attn.stats.max == 1.0 and attn.stats.mean == 0.25
    golden = open_dump(GOLDEN).poll()
    down = next(
        r
        for r in golden.tensors
        if r.key == by_key[(0, "root.model.layers.0.mlp.down_proj", "output")].key
    )
    values = load_array(down.loc)
    stats = by_key[(0, "root.model.layers.0.mlp.down_proj", "output")].stats
    assert stats.max == pytest.approx(float(values.max())) and stats.min == pytest.approx(
        float(values.min())
    )
    assert {k[2] for k in by_key if k[1] == "root.model.layers.0.mlp.down_proj"} == {
        "input_0",
        "output",
    }


def test_statistics_csv_cut_in_its_last_row_keeps_the_rows_before(tmp_path: Path) -> None:
    """A node's statistics.csv cut inside its last row (two outputs, the second cut): the
    whole rows keep their names (``output_0``, not the lone ``output`` of a one-output node),
    so they still pair with the golden's; the final read notes the cut line, a live read
    waits for it."""
    shutil.copytree(STATS, tmp_path / "stats", copy_function=shutil.copy2)
    csv_path = next((tmp_path / "stats").rglob("1/root.model.rotary_emb/statistics.csv"))
    text = csv_path.read_bytes()
    csv_path.write_bytes(text[: text.rindex(b"Output,1") + 5])
    whole = {r.key: r for r in open_dump(STATS).poll(None, final=True).tensors}
    live = open_dump(tmp_path / "stats").poll(None)
    assert not [n for n in live.notes if "cut short" in n]
    final = open_dump(tmp_path / "stats").poll(None, final=True)
    cut = {r.key: r for r in final.tensors}
    node = [k for k in cut if k.token == 1 and k.node == "root.model.rotary_emb"]
    assert sorted(k.stem for k in node) == ["input_0", "output_0"]
    assert all(cut[k].stats == whole[k].stats and cut[k].shape == whole[k].shape for k in node)
    assert set(cut) == set(whole) - {
        next(
            k
            for k in whole
            if k.stem == "output_1" and k.token == 1 and k.node == "root.model.rotary_emb"
        )
    }
    assert [n for n in final.notes if n == f"{csv_path}: last line cut short, skipped"]


def _copy_tree_live(src: Path, dst: Path) -> list[Path]:
    """Copy a rank dir file by file in modification-time order; return the new paths in order."""
    files = sorted((p for p in src.rglob("*") if p.is_file()), key=lambda p: p.stat().st_mtime_ns)
    out = []
    for f in files:
        target = dst / f.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)
        out.append(target)
    return out


def test_live_polling_per_file_equals_a_full_scan(tmp_path: Path) -> None:
    rank = tmp_path / "msit_dump_x" / "torch_tensors" / "cpu_1000"
    rank.mkdir(parents=True)
    reader = open_dump(tmp_path / "msit_dump_x")
    seen = []
    ids: dict[int, tuple[int, ...]] = {}
    for path in _copy_tree_live(RANK, rank):
        update = reader.poll([path])
        seen += update.tensors
        ids.update(update.token_ids)
    full = open_dump(tmp_path / "msit_dump_x").poll().tensors
    assert sorted(r.key for r in seen) == sorted(r.key for r in full)
    assert len({r.key for r in seen}) == len(seen)  # never twice
    assert ids == IDS
    live_order = {r.key: r.order for r in seen}
    assert all(live_order[r.key] == r.order for r in full)


def test_a_partial_pth_is_skipped_then_read_once_complete(tmp_path: Path) -> None:
    rank = tmp_path / "torch_tensors" / "cpu_7"
    node = rank / "0" / "root.lin"
    node.mkdir(parents=True)
    reader = open_dump(tmp_path)
    data = (RANK / "0" / "root.lm_head" / "output.pth").read_bytes()
    path = node / "output.pth"
    path.write_bytes(data[: len(data) // 2])
    assert reader.poll([path]).tensors == []
    with open(path, "ab") as fh:
        fh.write(data[len(data) // 2 :])
    (record,) = reader.poll([path]).tensors  # the retry list picks it up even without an event
    assert record.key.node == "root.lin" and record.shape == (1, 1, 100)
    assert reader.poll([path]).tensors == [] and reader.poll().tensors == []


def _token0_copy(tmp_path: Path) -> Path:
    """Token 0 of the golden rank, copied with the times msit wrote it with (copy2 keeps them)."""
    rank = tmp_path / "torch_tensors" / "cpu_1"
    shutil.copytree(RANK, rank, ignore=shutil.ignore_patterns("1", "2", "weights"))
    return rank


def test_order_follows_mtimes_then_declaration(tmp_path: Path) -> None:
    rank = _token0_copy(tmp_path)
    # A tie (coarse clock): a module and its child at the module's time; the tree's post-order
    # decides.
    mlp = rank / "0" / "root.model.layers.1.mlp"
    tie = max(p.stat().st_mtime_ns for p in mlp.glob("*.pth"))
    for node in ("root.model.layers.1.mlp", "root.model.layers.1.mlp.down_proj"):
        for p in (rank / "0" / node).glob("*.pth"):
            os.utime(p, ns=(tie, tie))
    update = open_dump(rank).poll()
    order = {r.key.node: r.order for r in update.tensors}
    assert not update.notes
    # The times, not the declaration: HF declares input_layernorm after mlp and runs it first,
    # and runs q, k, v in that order (their names sort k, o, q, v).
    attn = "root.model.layers.0.self_attn."
    assert order["root.model.layers.0.input_layernorm"] < order[attn + "q_proj"]
    assert order[attn + "q_proj"] < order[attn + "k_proj"] < order[attn + "v_proj"]
    assert order["root.model.layers.1.mlp.down_proj"] < order["root.model.layers.1.mlp"]


@pytest.mark.parametrize("copy", ["path_order", "module_before_child"])
def test_a_copy_without_times_takes_the_tree_order_and_says_so(tmp_path: Path, copy: str) -> None:
    rank = _token0_copy(tmp_path)
    base = 1_700_000_000_000_000_000
    files = sorted((rank / "0").rglob("*.pth"))
    if copy == "path_order":  # git checkout, rsync without -t: written in path order
        stamps = {p: base + i * 1000 for i, p in enumerate(files)}
    else:  # keep the real times but make one module older than its child (cp -r order)
        stamps = {p: p.stat().st_mtime_ns for p in files}
        for p in (rank / "0" / "root.model.layers.0.self_attn").glob("*.pth"):
            stamps[p] = base
    for p, t in stamps.items():
        os.utime(p, ns=(t, t))
    update = open_dump(rank).poll()
    order = {r.key.node: r.order for r in update.tensors}
    assert any("file times do not follow execution" in n for n in update.notes)
    attn = "root.model.layers.0.self_attn."
    # The model tree's post-order: children in declaration order, then their module.
    chain = [attn + n for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
    chain += ["root.model.layers.0.self_attn", "root.model.layers.0.mlp"]
    assert [order[n] for n in chain] == sorted(order[n] for n in chain)


def test_removed_directory_is_a_note(tmp_path: Path) -> None:
    shutil.copytree(RANK, tmp_path / "cpu_1000")
    reader = open_dump(tmp_path / "cpu_1000")
    assert reader.poll().tensors
    shutil.rmtree(tmp_path / "cpu_1000")
    update = reader.poll([tmp_path / "cpu_1000" / "0"])
    assert update.tensors == [] and any("disappeared" in n for n in update.notes)
