"""Manual dump points (``dump_data``/``set_label``/``dump_region``) in a real tiny Llama.

The points are called from inside a plain function — a wrapped copy of transformers' eager
attention function — as a user would, to see the attention scores and probabilities that no
module returns. They must land in the dump as nodes of the current token, in execution order
between the modules around them, and pair by name between a golden and a target run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from layerwatch.capture import DumpConfig, dump_data, dump_region, register_hook, set_label
from layerwatch.capture.errors import LayerwatchError
from support import lwdump, tiny_hf

transformers = pytest.importorskip("transformers")
from transformers.models.llama import modeling_llama  # noqa: E402

LAYERS = (0, 1)


def attention_with_points(seen: list[tuple[str, torch.Tensor]], fault_layer: int | None = None):
    """transformers' eager attention with ``dump_data`` at the scores and the probabilities;
    ``fault_layer``: that layer forgets the 1/sqrt(d) scaling (a real kernel bug)."""

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        key_states = modeling_llama.repeat_kv(key, module.num_key_value_groups)
        value_states = modeling_llama.repeat_kv(value, module.num_key_value_groups)
        if module.layer_idx == fault_layer:
            scaling = 1.0
        scores = torch.matmul(query, key_states.transpose(2, 3)) * scaling
        if attention_mask is not None:
            scores = scores + attention_mask
        dump_data("scores", scores)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        set_label(data_src="pta", data_id="probs", data_val=probs)  # msit's spelling
        seen.append(("probs", probs.clone()))
        out = torch.matmul(probs, value_states).transpose(1, 2).contiguous()
        return out, probs

    return attention


def _capture(tmp: Path, monkeypatch: pytest.MonkeyPatch, fault_layer: int | None = None):
    seen: list[tuple[str, torch.Tensor]] = []
    monkeypatch.setattr(
        modeling_llama, "eager_attention_forward", attention_with_points(seen, fault_layer)
    )
    run = tiny_hf.capture(tiny_hf.build("llama"), tmp)
    return run, seen


def test_points_inside_the_attention_function_land_as_nodes(tmp_path, monkeypatch) -> None:
    run, seen = _capture(tmp_path, monkeypatch)
    lines = [ln for ln in lwdump.index(run) if ln["k"] == "t"]
    tokens = sorted({ln["token"] for ln in lines})
    assert tokens == list(range(tiny_hf.NEW_TOKENS))
    for token in tokens:
        at = {ln["node"]: ln for ln in lines if ln["token"] == token}
        for layer in LAYERS:
            attn = f"root.model.layers.{layer}.self_attn"
            for label in ("scores", "probs"):
                point = at[f"{attn}.{label}"]
                assert point["type"] == "dump_data" and point["stem"] == "output"
            order = [at[f"{attn}.{n}"]["order"] for n in ("v_proj", "scores", "probs", "o_proj")]
            assert order == sorted(order) and at[attn]["order"] > order[-1]
    # the bytes are the tensor the function computed (layer 0, prefill)
    first = next(ln for ln in lines if ln["node"] == "root.model.layers.0.self_attn.probs")
    assert torch.equal(lwdump.load(run, first), seen[0][1])
    assert list(seen[0][1].shape) == first["shape"]


def test_points_pair_by_name_and_the_fault_shows_at_its_point(tmp_path, monkeypatch) -> None:
    golden, _ = _capture(tmp_path / "golden", monkeypatch)
    target, _ = _capture(tmp_path / "target", monkeypatch, fault_layer=1)
    out = subprocess.run(
        [sys.executable, "-m", "layerwatch.tui.cli", "compare", str(golden), str(target), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    # At prefill the mask's finfo.min dominates the scores, so the probabilities show it first;
    # at a decode step (no masked position) the scores themselves fail.
    first = report["first_failure"]
    assert (first["token"], first["node"]) == (0, "root.model.layers.1.self_attn.probs")
    rows = {(r["token"], r["node"]): r for r in report["rows"]}
    for token in range(tiny_hf.NEW_TOKENS):
        for label in ("scores", "probs"):
            assert rows[(token, f"root.model.layers.0.self_attn.{label}")]["verdict"] == "pass"
    assert rows[(1, "root.model.layers.1.self_attn.scores")]["verdict"] == "fail"


def test_region_names_points_and_nests(tmp_path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()

    def probe(x: torch.Tensor) -> None:  # a plain function, called between module calls
        with dump_region("probe"), dump_region("inner"):
            dump_data("x", x)
        dump_data("outside", x * 2)

    def run(m):
        with torch.no_grad():
            for _ in range(2):
                probe(m(torch.ones(1, 4)))

    cfg = DumpConfig(dump_path=tmp_path)
    with register_hook(model, cfg) as handle:
        run(model)  # root calls end before probe runs: nothing is captured outside a token
    assert not any(ln.get("type") == "dump_data" for ln in lwdump.index(handle.run_dir))

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = model

        def forward(self, x):
            y = self.body(x)
            probe(y)
            return y

    wrapped = Wrapped().eval()
    with register_hook(wrapped, DumpConfig(dump_path=tmp_path / "b")) as handle, torch.no_grad():
        for _ in range(2):
            wrapped(torch.ones(1, 4))
    nodes = {(ln["token"], ln["node"]) for ln in lwdump.index(handle.run_dir) if ln["k"] == "t"}
    for token in (0, 1):
        assert (token, "root.probe.inner.x") in nodes
        assert (token, "root.outside") in nodes  # inside the root module, in no region


def test_bad_labels_and_reuse_with_another_shape_say_so(tmp_path, capsys) -> None:
    with pytest.raises(LayerwatchError, match="'a/b' is not a name"):
        dump_data("a/b", torch.ones(1))
    with pytest.raises(LayerwatchError, match=r"needs a torch\.Tensor"):
        dump_data("x", [1, 2])
    with pytest.raises(LayerwatchError, match="tensor_path is not supported"):
        set_label(data_id="x", tensor_path="out.bin")

    class Twice(torch.nn.Module):
        def forward(self, x):
            dump_data("h", x)
            dump_data("h", x[:, :2])  # the same label for another tensor
            return x

    model = Twice()
    with register_hook(model, DumpConfig(dump_path=tmp_path)) as handle:
        model(torch.ones(1, 4))
    err = capsys.readouterr().err
    assert "label 'h' at token 0 in root was used for shapes [1, 4] and [1, 2]" in err
    nodes = {ln["node"]: ln["shape"] for ln in lwdump.index(handle.run_dir) if ln["k"] == "t"}
    assert nodes["root.h"] == [1, 4] and nodes["root.h#1"] == [1, 2]


def test_without_a_capture_nothing_is_written_and_it_says_so_once(monkeypatch, capsys) -> None:
    from layerwatch.capture import manual

    monkeypatch.setattr(manual, "_said_no_capture", False)
    dump_data("x", torch.ones(2))
    dump_data("y", torch.ones(2))
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "layerwatch: dump_data('x') outside any capture: nothing is written "
        "(register_hook or layerwatch dump first)"
    ]
