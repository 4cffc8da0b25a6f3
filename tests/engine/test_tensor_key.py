"""TensorKey as a named tuple (engine/records.py): the hash, equality and order of its fields'
tuple, as the dataclass of before had them; a changed copy by ``_replace``; and a key pickled
in one process finds its equal in another (string hashes differ between processes)."""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys

from layerwatch.engine.records import TensorKey


def test_hash_equality_and_order_are_the_fields() -> None:
    key = TensorKey(3, "root.model.layers.0.mlp", "output", 1)
    assert hash(key) == hash((3, "root.model.layers.0.mlp", "output", 1))
    same = TensorKey(3, "root.model.layers.0.mlp", "output", 1)
    assert key == same and {key: 1}[same] == 1
    assert key != TensorKey(3, "root.model.layers.0.mlp", "output", 0)
    assert sorted([TensorKey(2, "b", "x"), TensorKey(2, "a", "y"), TensorKey(1, "z", "z")]) == [
        TensorKey(1, "z", "z"),
        TensorKey(2, "a", "y"),
        TensorKey(2, "b", "x"),
    ]
    assert repr(key) == "TensorKey(token=3, node='root.model.layers.0.mlp', stem='output', rank=1)"
    moved = key._replace(token=4)
    assert hash(moved) == hash((4, key.node, key.stem, key.rank)) and copy.deepcopy(key) == key
    assert TensorKey(token=1, node="n", stem="input_0").rank == 0 and key.part == "output"
    assert (moved.token, moved.node, moved.stem, moved.rank) == (4, key.node, key.stem, 1)
    assert pickle.loads(pickle.dumps(key)) == key and type(copy.copy(key)) is TensorKey


def test_a_key_pickled_in_another_process_hashes_as_a_local_one() -> None:
    code = (
        "import pickle, sys\n"
        "from layerwatch.engine.records import TensorKey\n"
        "sys.stdout.buffer.write(pickle.dumps(TensorKey(5, 'root.lm_head', 'output')))\n"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    data = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, check=True, env=env
    ).stdout
    key = pickle.loads(data)
    assert key == TensorKey(5, "root.lm_head", "output")
    assert {TensorKey(5, "root.lm_head", "output"): "found"}.get(key) == "found"
