"""engine/session/ranks.py on records over real files: which slice of the golden each rank
gets, uneven shards, a missing rank, ``[[shard]]`` rules, and what is left out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.readers.load import load_array
from layerwatch.engine.records import Locator, TensorKey, TensorRecord
from layerwatch.engine.session.ranks import shard_rules, spread_golden, wants_spread


def _record(
    path: Path, array: np.ndarray, node: str, rank: int = 0, stem: str = "output", kind: str = ""
) -> TensorRecord:
    data = np.ascontiguousarray(array, dtype=np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    data.tofile(path)
    loc = Locator(str(path), 0, data.nbytes, "float32", data.shape)
    return TensorRecord(TensorKey(0, node, stem, rank), "float32", data.shape, loc, node_type=kind)


def _by_rank(records: list[TensorRecord], node: str) -> dict[int, np.ndarray]:
    return {r.key.rank: load_array(r.loc) for r in records if r.key.node == node}


def test_each_rank_gets_its_slice_or_the_whole(tmp_path: Path) -> None:
    full = np.arange(2 * 3 * 10, dtype=np.float32).reshape(2, 3, 10)
    golden = [
        _record(tmp_path / "g_up", full, "root.up"),
        _record(tmp_path / "g_norm", full, "root.norm"),
    ]
    cuts = [0, 4, 10]  # uneven: every rank is here, so the sizes decide
    target = [
        _record(tmp_path / f"t_up{r}", full[..., cuts[r] : cuts[r + 1]], "root.up", r)
        for r in (0, 1)
    ] + [_record(tmp_path / f"t_norm{r}", full, "root.norm", r) for r in (0, 1)]
    assert wants_spread(golden, target, 2)
    views, kept, notes = spread_golden(golden, target, 2)
    assert len(kept) == 4 and "2 sharded tensors" in notes[0]
    up = _by_rank(views, "root.up")
    np.testing.assert_array_equal(up[0], full[..., :4])
    np.testing.assert_array_equal(up[1], full[..., 4:])
    norm = _by_rank(views, "root.norm")
    assert set(norm) == {0, 1} and all(np.array_equal(v, full) for v in norm.values())


def test_a_missing_rank_leaves_equal_shards(tmp_path: Path) -> None:
    full = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    golden = [_record(tmp_path / "g", full, "root.w")]
    target = [_record(tmp_path / "t1", full[4:], "root.w", 1)]  # rank 1 of 2, rank 0 absent
    views, _, _ = spread_golden(golden, target, 2)
    np.testing.assert_array_equal(_by_rank(views, "root.w")[1], full[4:])


def test_shapes_that_are_no_shard_stay_whole(tmp_path: Path) -> None:
    full = np.zeros((4, 6), np.float32)
    golden = [_record(tmp_path / "g", full, "root.x")]
    target = [_record(tmp_path / "t0", np.zeros((2, 3), np.float32), "root.x", 0)]
    target.append(_record(tmp_path / "t1", np.zeros((2, 3), np.float32), "root.x", 1))
    views, _, notes = spread_golden(golden, target, 2)
    assert all(v.shape == (4, 6) for v in views) and not notes  # compared whole: shape error


def test_reduction_inputs_and_collectives_the_golden_lacks_are_left_out(tmp_path: Path) -> None:
    x = np.ones((2, 4), np.float32)
    golden = [_record(tmp_path / "g", x, "root.down", kind="RowParallelLinear")]
    target = []
    for r in (0, 1):
        target.append(_record(tmp_path / f"d{r}", x, "root.down", r, kind="RowParallelLinear"))
        for stem in ("input_0", "output"):
            target.append(
                _record(
                    tmp_path / f"a{r}{stem}", x, "root.down.all_reduce.0", r, stem, "all_reduce"
                )
            )
    views, kept, notes = spread_golden(golden, target, 2)
    assert {r.key.node for r in kept} == {"root.down"}
    assert any("collective calls the golden does not have" in n for n in notes)
    # the module that ran the reduction is not one operator for the local verdict
    assert {r.node_type for r in kept + views} == {"RowParallelLinear+all_reduce"}
    # with the collective in the golden too (a torchrun golden of one rank): outputs compared
    golden += [
        _record(tmp_path / f"g{s}", x, "root.down.all_reduce.0", 0, s, "all_reduce")
        for s in ("input_0", "output")
    ]
    views, kept, notes = spread_golden(golden, target, 2)
    assert {(r.key.node, r.key.stem) for r in kept if "all_reduce" in r.key.node} == {
        ("root.down.all_reduce.0", "output")
    }
    assert any("partial sums" in n for n in notes)


def test_shard_rules_override_the_shapes(tmp_path: Path) -> None:
    rules_file = tmp_path / "map.toml"
    rules_file.write_text(
        '[[shard]]\npattern = "qkv$"\ndim = 0\n[[shard]]\npattern = "^root.rep"\ndim = "replicated"\n'
    )
    rules = shard_rules(rules_file)
    full = np.arange(16, dtype=np.float32).reshape(4, 4)
    golden = [_record(tmp_path / "g", full, "root.qkv"), _record(tmp_path / "r", full, "root.rep")]
    target = [
        _record(tmp_path / f"t{r}", full[2 * r : 2 * r + 2], "root.qkv", r) for r in (0, 1)
    ] + [_record(tmp_path / f"p{r}", full[:, :2], "root.rep", r) for r in (0, 1)]
    views, _, _ = spread_golden(golden, target, 2, rules)
    np.testing.assert_array_equal(_by_rank(views, "root.qkv")[1], full[2:])
    assert all(v.shape == (4, 4) for v in views if v.key.node == "root.rep")
    bad = tmp_path / "bad.toml"
    bad.write_text('[[shard]]\npattern = "x"\n')
    with pytest.raises(LayerwatchError, match="shard rule 1 needs"):
        shard_rules(bad)


def test_same_ranks_on_both_sides_need_no_spreading(tmp_path: Path) -> None:
    x = np.ones(3, np.float32)
    two = [_record(tmp_path / f"x{r}", x, "root.a", r) for r in (0, 1)]
    assert not wants_spread(two, two, 2)
    one = [_record(tmp_path / "y", x, "root.a")]
    assert not wants_spread(one, one, None)


def test_any_arrival_order_gives_the_same_records(tmp_path: Path) -> None:
    """The live pipeline feeds records in batches, either side first, finishing in either
    order: the session gets the same golden views and target records as for finished dumps."""
    import random

    from layerwatch.engine.session.ranks import RankSpread

    full = np.arange(4 * 6, dtype=np.float32).reshape(4, 6)
    golden, target = [], []
    for token in range(3):
        for node in ("root.up", "root.norm"):
            golden.append(_record(tmp_path / f"g{token}{node}", full, node))
            golden[-1].key = TensorKey(token, node, "output", 0)
            for r in (0, 1):
                part = full[:, 3 * r : 3 * r + 3] if node == "root.up" else full
                target.append(_record(tmp_path / f"t{token}{node}{r}", part, node, r))
                target[-1].key = TensorKey(token, node, "output", r)
    want_g, want_t, _ = spread_golden(golden, target, 2)

    def key(records: list[TensorRecord]) -> set[tuple[object, ...]]:
        return {(r.key, r.shape, r.loc) for r in records}

    for seed in range(5):
        rng = random.Random(seed)
        events = [("golden", r) for r in golden] + [("target", r) for r in target]
        rng.shuffle(events)
        spread = RankSpread(2)
        got_g: list[TensorRecord] = []
        got_t: list[TensorRecord] = []
        for side, rec in events:
            g, t = spread.feed(side, [rec])
            got_g += g
            got_t += t
        for side in rng.sample(["golden", "target"], 2):
            g, t = spread.finish(side)
            got_g += g
            got_t += t
        assert key(got_g) == key(want_g) and key(got_t) == key(want_t)
