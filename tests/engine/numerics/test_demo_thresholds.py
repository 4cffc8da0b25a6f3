"""The default thresholds on the demo model (layerwatch.capture.demo): benign targets raise no
failure on any token or layer, every FAULTS entry fails first at its operator at its start
token — in memory (teacher-forced, plain hooks) and through register_hook + reader + session."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from layerwatch.engine.numerics.thresholds import Thresholds
from layerwatch.engine.records import Verdict
from layerwatch.engine.session.core import CompareSession
from support.sessions import compare_dumps

demo = pytest.importorskip("layerwatch.capture.demo")
if not hasattr(demo, "FAULTS"):
    pytest.skip("the demo model has not landed yet", allow_module_level=True)

_SPEC = importlib.util.spec_from_file_location(
    "calibrate_thresholds", Path(__file__).parents[2] / "bench" / "calibrate_thresholds.py"
)
assert _SPEC is not None and _SPEC.loader is not None
calib = sys.modules.get("calibrate_thresholds") or importlib.util.module_from_spec(_SPEC)
if "calibrate_thresholds" not in sys.modules:
    sys.modules["calibrate_thresholds"] = calib
    _SPEC.loader.exec_module(calib)

TH = Thresholds.load()
NEW_TOKENS = 8
CFG = replace(demo.DemoConfig(), seed=2024, n_layers=6)


@pytest.fixture(scope="module")
def golden():
    torch.set_num_threads(1)
    prompt = demo.make_prompt(vocab_size=CFG.vocab_size)
    return prompt, calib.capture(
        demo.build_model(config=CFG), prompt, NEW_TOKENS, step=calib.demo_step
    )


def run(prompt, feed, *, dtype: str = "fp32", fault: str | None = None):
    model = demo.build_model(dtype=dtype, fault=fault, config=CFG)
    return calib.capture(model, prompt, NEW_TOKENS, feed=feed, step=calib.demo_step)


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_benign_demo_targets_raise_no_failure(golden, dtype: str) -> None:
    prompt, gold = golden
    rows = calib.compare_runs(gold, run(prompt, gold.ids, dtype=dtype), TH, calib.DEMO_LOGITS)
    assert len(rows) > 500
    assert [f"{r.key}: {r.reason}" for r in rows if r.verdict is not Verdict.PASS] == []


@pytest.mark.parametrize("name", sorted(demo.FAULTS))
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_every_demo_fault_fails_first_at_its_operator(golden, name: str, dtype: str) -> None:
    prompt, gold = golden
    fault = demo.FAULTS[name]
    rows = calib.compare_runs(
        gold, run(prompt, gold.ids, dtype=dtype, fault=name), TH, calib.DEMO_LOGITS
    )
    first = next(r for r in rows if r.verdict is not Verdict.PASS)
    assert (first.key[0], first.key[1]) == (fault.start_token, fault.node), first.reason
    assert first.key[2].startswith("output") and first.verdict is Verdict.FAIL


def dump_demo(out: Path, *, dtype: str = "fp32", fault: str | None = None) -> Path:
    from layerwatch.capture import DumpConfig, register_hook

    model = demo.build_model(dtype=dtype, fault=fault, config=CFG)
    with register_hook(model, DumpConfig(dump_path=out)) as handle:
        demo.generate(model, demo.make_prompt(vocab_size=CFG.vocab_size), new_tokens=NEW_TOKENS)
    return Path(handle.run_dir)


def session_of(golden: Path, target: Path) -> CompareSession:
    return compare_dumps(golden, target)


@pytest.fixture(scope="module")
def golden_dump(tmp_path_factory) -> Path:
    return dump_demo(tmp_path_factory.mktemp("demo-golden"))


@pytest.mark.slow
def test_demo_bf16_through_the_pipeline_has_no_failure(golden_dump: Path, tmp_path: Path) -> None:
    session = session_of(golden_dump, dump_demo(tmp_path, dtype="bf16"))
    verdicts = {r.verdict for r in session.results()}
    assert Verdict.FAIL not in verdicts and Verdict.ERROR not in verdicts
    assert session.first_failure is None


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(demo.FAULTS))
def test_demo_fault_through_the_pipeline_is_the_first_failure(
    golden_dump: Path, tmp_path: Path, name: str
) -> None:
    fault = demo.FAULTS[name]
    session = session_of(golden_dump, dump_demo(tmp_path, fault=name))
    first = session.first_failure
    assert first is not None
    assert (first.token, first.node) == (fault.start_token, fault.node)
    assert first.stem.startswith("output") and first.verdict is Verdict.FAIL
