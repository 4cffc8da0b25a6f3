"""``layerwatch dump --follow``: teacher forcing through the zero-code bootstrap on the demo model."""

from __future__ import annotations

import json
import sys

import pytest
from live.helpers import index_records, layerwatch

DEMO = [sys.executable, "-m", "layerwatch.capture.demo", "--new-tokens", "8"]


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    out = tmp_path_factory.mktemp("golden") / "g"
    proc = layerwatch("dump", "--out", str(out), "--", *DEMO)
    assert proc.returncode == 0, proc.stderr
    return out, (out / "layerwatch.log").read_text().split()


def test_a_flipping_fault_is_followed_and_compared_to_the_end(golden, tmp_path):
    g, golden_tokens = golden
    t = tmp_path / "t"
    proc = layerwatch(
        "dump", "--out", str(t), "--follow", str(g), "--", *DEMO, "--fault", "kv_cache"
    )
    assert proc.returncode == 0, proc.stderr
    printed = (t / "layerwatch.log").read_text().split()
    assert printed[:-1] == golden_tokens[:-1]  # the hand-written argmax loop printed the golden's
    flips = [r for r in index_records(t) if r["k"] == "follow" and r["own_id"] != r["fed_id"]]
    assert flips[0]["token"] == 5  # kv_cache starts at token 5 and flips it at once
    report = json.loads(layerwatch("compare", str(g), str(t), "--json").stdout)
    assert report["summary"]["diverged"] == 0
    assert report["first_bad_token"] == 5
    assert report["root_cause"]["node"] == "root.layers.3.attention.cache"
    assert {r["token"] for r in report["rows"]} == set(range(8))  # every token compared


def test_another_prompt_stops_the_child_and_dump_exits_2(golden, tmp_path):
    g, _ = golden
    t = tmp_path / "t"
    proc = layerwatch("dump", "--out", str(t), "--follow", str(g), "--", *DEMO, "--prompt-len", "5")
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("layerwatch dump: follow: token 0: the prompt differs")
    assert "follow: token 0" in (t / "layerwatch.log").read_text()


@pytest.mark.parametrize("golden_arg", ["missing", "empty"])
def test_an_unusable_golden_is_one_line_before_the_run(tmp_path, golden_arg):
    (tmp_path / "empty").mkdir()
    proc = layerwatch(
        "dump", "--out", str(tmp_path / "t"), "--follow", str(tmp_path / golden_arg), "--", *DEMO
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "follow:" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "t").exists()  # refused before the child started
