"""``compare GOLDEN D --ray ADDRESS``: each rank compared in a Ray task on the node holding it.

Ray's local multi-node test cluster (``ray.cluster_utils.Cluster``: a head and one more node,
one CPU each, no dashboard) is started once for the module and always shut down. The dumps are
real TP=2 captures (tests/support/tp_capture.py): the benign run and rank 1's corrupted
all-reduce. Every case compares ``--ray`` with the local compare: same rows, first failure,
exit code. The bad-input cases (no Ray, no cluster at the address) run without Ray installed.
"""

from __future__ import annotations

import json
import shutil
import socket
import sys
from pathlib import Path

import numpy as np
import pytest
from layerwatch.engine.raycompare import plan
from layerwatch.tui.cli import main
from support.tp_capture import capture_tp_dumps


@pytest.fixture(scope="module")
def cluster() -> object:
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    store = 80 * 2**20  # Ray's floor is 75 MiB; the rows are small
    head = {"num_cpus": 1, "include_dashboard": False, "object_store_memory": store}
    c = Cluster(initialize_head=True, head_node_args=head)
    try:
        c.add_node(num_cpus=1, object_store_memory=store)
        c.wait_for_nodes()
        yield c
    finally:
        c.shutdown()


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("ray")
    return capture_tp_dumps(tmp_path_factory.mktemp("tp"), ("golden", "benign", "allreduce"))


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = main([*argv, "--json"])
    text = capsys.readouterr().out
    return code, json.loads(text) if text.strip() else {}


def _no_local_read(*args: object, **kwargs: object) -> None:
    raise OSError("the driver must not read tensor bytes")


def _rows(report: dict) -> list[str]:
    """Every row, field for field (metrics included), in a stable order."""
    return sorted(json.dumps(r, sort_keys=True) for r in report["rows"])


@pytest.mark.slow
@pytest.mark.parametrize("target", ["benign", "allreduce"])
def test_ray_compare_matches_the_local_compare(
    cluster: object,
    dumps: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    target: str,
) -> None:
    golden, tp = str(dumps["golden"]), str(dumps[target])
    local_code, local = _cli(capsys, "compare", golden, tp)
    with monkeypatch.context() as m:  # the driver reads no tensor: the nodes' tasks do
        for name in ("fromfile", "memmap"):
            m.setattr(np, name, _no_local_read)
        code, remote = _cli(capsys, "compare", golden, tp, "--ray", cluster.address)
        if target == "allreduce":  # the patch bites: a local compare cannot read a tensor
            _, blind = _cli(capsys, "compare", golden, tp)
            assert _rows(blind) != _rows(local)
    assert code == local_code == (0 if target == "benign" else 1)
    assert remote["first_failure"] == local["first_failure"]
    assert _rows(remote) == _rows(local)
    assert {r["rank"] for r in remote["rows"]} == {0, 1}
    assert remote["summary"] == local["summary"]
    if target == "allreduce":
        first = remote["first_failure"]
        assert (first["token"], first["node"], first["rank"]) == (1, "root.layers.1.down", 1)


@pytest.mark.slow
def test_a_missing_rank_is_named_and_the_csv_report_is_the_local_one(
    cluster: object, dumps: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing"
    shutil.copytree(dumps["benign"], missing)
    shutil.rmtree(missing / "rank1")
    golden = str(dumps["golden"])
    local_code, local = _cli(capsys, "compare", golden, str(missing))
    code, remote = _cli(capsys, "compare", golden, str(missing), "--ray", cluster.address)
    assert code == local_code == 0
    assert _rows(remote) == _rows(local) and {r["rank"] for r in remote["rows"]} == {0}
    assert main(["compare", golden, str(missing), "--ray", cluster.address]) == 0
    assert "rank 1 of 2 has no tensors" in capsys.readouterr().out  # the summary's notes
    csv = {}
    for label, extra in (("local", []), ("ray", ["--ray", cluster.address])):
        csv[label] = tmp_path / f"{label}.csv"
        assert (
            main(["compare", golden, str(dumps["allreduce"]), "-o", str(csv[label]), *extra]) == 1
        )
    capsys.readouterr()
    assert csv["ray"].read_text() == csv["local"].read_text()


@pytest.mark.slow
def test_each_rank_runs_on_its_own_node(cluster: object, dumps: dict[str, Path]) -> None:
    from layerwatch.engine.raycompare import run_ranks

    outcomes, notes, world = run_ranks(
        cluster.address, str(dumps["golden"]), str(dumps["benign"]), {}
    )
    assert world == 2 and notes == []
    assert sorted(o.rank for o in outcomes) == [0, 1]
    assert len({o.node_id for o in outcomes}) == 2  # both nodes see both ranks: spread


def test_plan_pins_each_rank_to_a_node_holding_it_and_the_golden() -> None:
    probes = [
        ("A", {0: 4, 1: 4}, True),
        ("B", {2: 4}, True),
        ("C", {3: 4}, False),  # holds rank 3 but not the golden
        ("D", {0: 4, 1: 4}, True),
    ]
    chosen, world = plan(probes)
    assert world == 4
    assert chosen == {0: "A", 1: "D", 2: "B"}  # rank 3: nowhere to run (a note says so)


def test_ray_not_installed_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    code = main(["compare", str(tmp_path), str(tmp_path), "--ray", "127.0.0.1:1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "layerwatch[ray]" in err[0]


def test_unreachable_address_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("ray")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = main(["compare", str(tmp_path), str(tmp_path), "--ray", f"127.0.0.1:{port}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert f"127.0.0.1:{port}" in err[0] and "cannot reach" in err[0]
