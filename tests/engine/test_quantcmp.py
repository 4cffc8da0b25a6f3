"""``compare --fake-quant``: a tiny Llama, float golden, int8 fake-quant, simulated real-quant.

The target runs every Linear as a real int8 kernel would: ``(x · qᵀ) · scale`` with the integer
weights, the per-channel scale applied after the matmul. The faulty target applies a wrong
scale to a few output channels of one Linear at run time. The int8 rounding itself (golden vs
fake-quant) is far outside the fp32 limits; it must not be blamed on a kernel.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from layerwatch.tui.cli import main

from tests.fixtures.tiny_llama import build

FAULT = "root.model.layers.1.mlp.down_proj"
PROMPTS = ([[11, 42, 7, 93, 5, 60]], [[3, 17, 29, 8, 71, 44]])


def _int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: integer values (as float) and the scale."""
    scale = w.abs().amax(1, keepdim=True) / 127
    return torch.clamp(torch.round(w / scale), -127, 127), scale.squeeze(1)


def _real_quant(linear: torch.nn.Linear, q: torch.Tensor, scale: torch.Tensor) -> Callable:
    def forward(x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.linear(x, q) * scale
        return y if linear.bias is None else y + linear.bias

    return forward


def _capture(path: Path, mode: str) -> None:
    """``golden`` float; ``fq`` dequantised weights, float kernels; ``target``/``faulty``
    integer weights with the scale after the matmul (``faulty``: 3 channels of one Linear
    scaled by 1.04)."""
    from layerwatch.capture import DumpConfig, register_hook

    model = build()
    with torch.no_grad():
        for name, module in model.named_modules():
            if not isinstance(module, torch.nn.Linear) or "proj" not in name:
                continue
            q, scale = _int8(module.weight)
            if mode == "fq":
                module.weight.copy_(q * scale[:, None])
            elif mode in ("target", "faulty"):
                if mode == "faulty" and "root." + name == FAULT:
                    scale = scale.clone()
                    scale[:3] *= 1.04
                module.forward = _real_quant(module, q, scale)  # type: ignore[method-assign]
                module.weight = torch.nn.Parameter(q.to(torch.int8), requires_grad=False)
    with register_hook(model, DumpConfig(dump_path=str(path))), torch.no_grad():
        for ids in PROMPTS:
            model(torch.tensor(ids))


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("quant")
    out = {}
    for mode in ("golden", "fq", "target", "faulty"):
        _capture(root / mode, mode)
        out[mode] = str(root / mode)
    return out


def _compare(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    code = main(["compare", *args, "--json", "--jobs", "1"])
    return code, json.loads(capsys.readouterr().out)


def test_quantisation_error_is_not_blamed_on_the_kernel(
    dumps: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, plain = _compare(capsys, dumps["golden"], dumps["target"])
    assert code == 1 and plain["first_failure"] is not None  # blames the int8 rounding
    code, obj = _compare(capsys, dumps["golden"], dumps["target"], "--fake-quant", dumps["fq"])
    assert code == 0, obj["first_failure"]
    assert obj["first_failure"] is None
    assert obj["summary"]["quantisation"]["fail"] > 0  # the error exists, attributed
    assert obj["quantisation_first_failure"] is not None
    causes = {r["cause"] for r in obj["rows"]}
    assert causes <= {"quantisation", "none"} and "quantisation" in causes
    row = next(r for r in obj["rows"] if r["cause"] == "quantisation")
    assert row["verdict"] == "pass" and row["kernel"]["verdict"] == "pass"
    assert row["quantisation"]["verdict"] == "fail"


def test_a_wrong_runtime_scale_is_found_at_its_linear(
    dumps: dict[str, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, plain = _compare(capsys, dumps["golden"], dumps["faulty"])
    assert code == 1 and plain["first_failure"]["node"] != FAULT  # buried in quant noise
    args = [dumps["golden"], dumps["faulty"], "--fake-quant", dumps["fq"]]
    code, obj = _compare(capsys, *args)
    assert code == 1
    first = obj["first_failure"]
    assert (first["token"], first["node"], first["tensor"]) == (0, FAULT, "output")
    row = next(
        r for r in obj["rows"] if (r["token"], r["node"], r["tensor"]) == (0, FAULT, "output")
    )
    assert row["cause"] == "kernel" and row["kernel"]["verdict"] == "fail"
    assert "weights differ" not in obj["root_cause"]["reason"]  # int8 weights: expected
    assert row["quantisation"] is not None
    out = tmp_path / "q.csv"
    assert main(["compare", *args, "-o", str(out), "--jobs", "1"]) == 1
    with open(out, newline="") as fh:
        lines = list(csv.DictReader(fh))
    assert {"quant_verdict", "quant_relative_euclidean_distance", "cause"} <= set(lines[0])
    assert any(r["cause"] == "kernel" for r in lines)
    assert main(["compare", *args]) == 1
    text = capsys.readouterr().out
    assert "kernel part" in text and "quantisation part" in text and "down_proj" in text


def test_a_missing_fake_quant_dump_is_one_line(
    dumps: dict[str, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["compare", dumps["golden"], dumps["target"], "--fake-quant", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and "fake-quant dump" in err and "Traceback" not in err


def test_open_shows_the_kernel_part(
    dumps: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Headless ``open --fake-quant`` prints the three-way summary and exits as compare; the
    TUI's arguments become the kernel part (fake-quant vs target, kernel thresholds)."""
    import argparse

    from layerwatch.engine.quantcmp import QUANT_KERNEL_RED, kernel_args

    args = [dumps["golden"], dumps["faulty"], "--fake-quant", dumps["fq"]]
    assert main(["open", *args, "--headless"]) == 1
    assert "kernel part" in capsys.readouterr().out
    ns = argparse.Namespace(
        golden=dumps["golden"], target=dumps["faulty"], fake_quant=dumps["fq"], thresholds=None
    )
    turned = kernel_args(ns)
    assert (turned.golden, turned.target) == (dumps["fq"], dumps["faulty"])
    packaged = turned.thresholds.local["fp32"]["linear"].red - QUANT_KERNEL_RED
    assert packaged == pytest.approx(1.34)


def test_the_operator_view_of_the_kernel_part_shows_the_quantisation_part(
    dumps: dict[str, str],
) -> None:
    """The session the TUI opens (fake-quant vs target) explains a pair with both parts."""
    from layerwatch.engine.precheck import precheck_sentence
    from layerwatch.engine.quantcmp import QuantisationLine, kernel_thresholds
    from layerwatch.engine.readers import open_dump
    from layerwatch.engine.session.core import CompareSession

    session = CompareSession(thresholds=kernel_thresholds(None), jobs=1)
    session.operator_check = QuantisationLine(dumps["golden"], dumps["fq"], None, precheck_sentence)
    try:
        for side, path in (("golden", dumps["fq"]), ("target", dumps["faulty"])):
            session.add_update(side, open_dump(path, side=side).poll(None, final=True))
            session.finish(side)
        session.flush()
        result = next(
            r
            for r in session.results()
            if (r.key.token, r.key.node, r.key.stem) == (0, FAULT, "output")
        )
        sentence = session.explain(result).sentence
    finally:
        session.close()
    assert result.verdict.value == "fail"
    assert "quantisation part (golden vs fake-quant): fail" in sentence, sentence


def test_per_case_dumps_are_refused_in_one_line(
    dumps: dict[str, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from layerwatch.capture import DumpConfig, case, register_hook

    model = build()
    with register_hook(model, DumpConfig(dump_path=str(tmp_path / "cases"))), torch.no_grad():
        for key, ids in zip("ab", PROMPTS, strict=True):
            with case(key):
                model(torch.tensor(ids))
    args = [dumps["golden"], str(tmp_path / "cases"), "--fake-quant", dumps["fq"]]
    assert main(["compare", *args]) == 2
    err = capsys.readouterr().err
    assert "several cases" in err and "Traceback" not in err
