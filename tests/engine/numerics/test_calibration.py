"""The default thresholds on real models: benign runs raise nothing, every fault fails at its
operator at its start token (the calibration sweep, tests/bench/calibrate_thresholds.py,
holds the same properties over more configurations and prints the numbers)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from layerwatch.engine.numerics.thresholds import Thresholds
from layerwatch.engine.records import Verdict

_SPEC = importlib.util.spec_from_file_location(
    "calibrate_thresholds", Path(__file__).parents[2] / "bench" / "calibrate_thresholds.py"
)
assert _SPEC is not None and _SPEC.loader is not None
calib = importlib.util.module_from_spec(_SPEC)
sys.modules["calibrate_thresholds"] = calib
_SPEC.loader.exec_module(calib)

TH = Thresholds.load()
NEW_TOKENS = 4


@pytest.fixture(
    scope="module", params=[(7, 2, 64), (8, 3, 96)], ids=lambda p: f"seed{p[0]}-L{p[1]}-h{p[2]}"
)
def llama_run(request):
    torch.set_num_threads(1)
    seed, layers, hidden = request.param
    model = calib.llama(seed, layers, hidden)
    prompt = torch.randint(0, 512, (1, 10), generator=torch.Generator().manual_seed(seed))
    golden = calib.capture(model, prompt, NEW_TOKENS)
    return model, prompt, golden, layers


@pytest.mark.parametrize("target", ["fp32 rerun", "fp32 sdpa", "bf16", "fp16"])
def test_benign_targets_raise_no_failure(llama_run, target: str) -> None:
    model, prompt, golden, _ = llama_run
    target_model = calib.benign_targets(model)[target]
    run = calib.capture(target_model, prompt, NEW_TOKENS, feed=golden.ids)
    rows = calib.compare_runs(golden, run, TH)
    assert len(rows) > 100
    bad = [
        f"t{r.key[0]} {r.key[1]}:{r.key[2]}: {r.reason}"
        for r in rows
        if r.verdict is not Verdict.PASS
    ]
    assert bad == []
    stats_bad = [
        r.reason for r in calib.stats_rows(golden, run, TH) if r.verdict is not Verdict.PASS
    ]
    assert stats_bad == []


@pytest.mark.parametrize("fault_index", range(5))
def test_every_fault_fails_first_at_its_operator(llama_run, fault_index: int) -> None:
    model, prompt, golden, layers = llama_run
    fault = calib.llama_faults(layers)[fault_index]
    run = calib.capture_with_fault(model, fault, "float32", prompt, NEW_TOKENS, golden.ids)
    rows = calib.compare_runs(golden, run, TH)
    outcome = calib.fault_outcome("test", fault, "float32", rows)
    assert outcome["caught"], outcome["reason"]
    assert outcome["first_failure"].startswith(f"t{fault.start} {fault.node}:output")
    assert outcome["earlier_failures"] == 0
