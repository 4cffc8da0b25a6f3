"""``layerwatch weights``: real checkpoints of a tiny Llama, converted and broken on purpose."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch
from layerwatch.tui.cli import main
from safetensors.torch import load_file, save_file

from tests.fixtures.tiny_llama import build

DOWN = "model.layers.1.mlp.down_proj.weight"
UP = "model.layers.1.mlp.up_proj.weight"
Q = "model.layers.0.self_attn.q_proj.weight"
K = "model.layers.0.self_attn.k_proj.weight"


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("golden")
    build().save_pretrained(path)
    return path


def _state(golden: Path) -> dict[str, torch.Tensor]:
    return load_file(str(golden / "model.safetensors"))


def _save(tmp_path: Path, state: dict[str, torch.Tensor], name: str = "model.safetensors") -> Path:
    out = tmp_path / "target"
    out.mkdir(exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / name))
    return out


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    code = main(["weights", *args, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else {}


def _int8(state: dict[str, torch.Tensor], offset: bool = False) -> dict[str, torch.Tensor]:
    """Per-output-channel symmetric (or asymmetric with an offset) int8 of every 2-D weight."""
    out: dict[str, torch.Tensor] = {}
    for name, w in state.items():
        if w.ndim != 2 or not name.endswith("proj.weight"):
            out[name] = w
            continue
        w = w.float()
        if offset:
            lo, hi = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
            scale = (hi - lo) / 255
            off = torch.round(-128 - lo / scale)
            q = torch.clamp(torch.round(w / scale + off), -128, 127)
            out[name + "_offset"] = off.squeeze(1)
        else:
            scale = w.abs().amax(1, keepdim=True) / 127
            q = torch.clamp(torch.round(w / scale), -127, 127)
        out[name] = q.to(torch.int8)
        out[name + "_scale"] = scale.squeeze(1)
    return out


def _fp8(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, w in state.items():
        if w.ndim != 2 or not name.endswith("proj.weight"):
            out[name] = w
            continue
        scale = w.float().abs().max() / 448
        out[name] = (w.float() / scale).to(torch.float8_e4m3fn)
        out[name + "_scale"] = scale.reshape(1)
    return out


def test_same_checkpoint_passes_sharded_and_bin(
    golden: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.manual_seed(0)
    model = build()
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    model.save_pretrained(tmp_path / "bin", safe_serialization=False)
    for other in ("sharded", "bin"):
        code, obj = _run(capsys, str(golden), str(tmp_path / other))
        assert code == 0, obj
        assert obj["summary"]["failed"] == 0
        assert obj["summary"]["compared"] == len(_state(golden)), other
        assert obj["first_failure"] is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cast_passes(
    golden: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], dtype: torch.dtype
) -> None:
    target = _save(tmp_path, {k: v.to(dtype) for k, v in _state(golden).items()})
    code, obj = _run(capsys, str(golden), str(target))
    assert code == 0, obj["first_failure"]
    assert {r["kind"] for r in obj["rows"]} == {"bf16" if dtype == torch.bfloat16 else "fp16"}


@pytest.mark.parametrize("offset", [False, True])
def test_int8_per_channel_passes(
    golden: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], offset: bool
) -> None:
    target = _save(tmp_path, _int8(_state(golden), offset))
    code, obj = _run(capsys, str(golden), str(target))
    assert code == 0, obj["first_failure"]
    assert obj["summary"]["unmatched_target"] == 0  # scales and offsets are consumed
    assert "int8" in {r["kind"] for r in obj["rows"]}


def test_fp8_passes(golden: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = _save(tmp_path, _fp8(_state(golden)))
    code, obj = _run(capsys, str(golden), str(target))
    assert code == 0, obj["first_failure"]
    assert "fp8" in {r["kind"] for r in obj["rows"]}


def _faulty(state: dict[str, torch.Tensor], fault: str) -> dict[str, torch.Tensor]:
    state = dict(state)
    if fault == "scaled":
        state[DOWN] = state[DOWN] * 1.03
    elif fault == "transposed":
        state[Q] = state[Q].t()  # square: same shape, wrong layout
    elif fault == "swapped":
        state[Q], state[K] = state[K], state[Q]
    return state


@pytest.mark.parametrize("convert", ["bf16", "int8", "fp8"])
@pytest.mark.parametrize("fault", ["scaled", "transposed", "swapped", "wrong_scale"])
def test_one_tensor_fault_fails(
    golden: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], convert: str, fault: str
) -> None:
    state = _state(golden)
    if fault != "wrong_scale":
        state = _faulty(state, fault)
    if convert == "bf16":
        if fault == "wrong_scale":
            pytest.skip("a cast has no scale")
        state = {k: v.to(torch.bfloat16) for k, v in state.items()}
    else:
        state = _int8(state) if convert == "int8" else _fp8(state)
        if fault == "wrong_scale":
            state[DOWN + "_scale"] = state[DOWN + "_scale"] * 1.03
    code, obj = _run(capsys, str(golden), str(_save(tmp_path, state)))
    assert code == 1
    expected = {"scaled": [DOWN], "wrong_scale": [DOWN], "transposed": [Q], "swapped": [K, Q]}
    assert obj["failures"] == expected[fault], obj["rows"]


def test_prefix_and_fingerprint_matching(
    golden: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = _state(golden)
    renamed = {"module." + k: v for k, v in state.items()}
    renamed["module.renamed.down"] = renamed.pop("module." + DOWN)
    renamed["extra.bias"] = torch.zeros(3)
    code, obj = _run(capsys, str(golden), str(_save(tmp_path, renamed)))
    assert code == 0
    how = {r["name"]: r["matched_by"] for r in obj["rows"]}
    assert how[DOWN] == "fingerprint" and how[UP] == "prefix"
    assert obj["unmatched_target"] == ["extra.bias"]


def test_corrupted_shard_is_named_others_compared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.manual_seed(0)
    model = build()
    model.save_pretrained(tmp_path / "g", max_shard_size="20KB")
    model.save_pretrained(tmp_path / "t", max_shard_size="20KB")
    shards = sorted((tmp_path / "t").glob("*.safetensors"))
    data = shards[1].read_bytes()
    shards[1].write_bytes(data[: len(data) // 2])  # truncated
    shards[2].unlink()  # named by the index, missing
    code = main(["weights", str(tmp_path / "g"), str(tmp_path / "t"), "--json"])
    obj = json.loads(capsys.readouterr().out)
    assert code == 1
    assert obj["summary"]["compared"] > 0 and obj["summary"]["unmatched_golden"] > 0
    notes = " ".join(obj["notes"])
    assert shards[1].name in notes and shards[2].name in notes and "missing" in notes


class _Evil:
    marker = ""

    def __reduce__(self) -> tuple:
        return (os.mkdir, (self.marker,))


def test_bad_inputs_exit_2(
    tmp_path: Path, golden: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _Evil.marker = str(tmp_path / "ran")
    evil = tmp_path / "evil.pth"
    evil.write_bytes(pickle.dumps({"w": _Evil()}))
    torch.save({"w": _Evil()}, tmp_path / "evil_zip.pt")
    for target in (tmp_path / "nope", evil, tmp_path / "evil_zip.pt"):
        assert main(["weights", str(golden), str(target)]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and str(target) in err
    assert not (tmp_path / "ran").exists()
    bad_index = tmp_path / "idx"
    bad_index.mkdir()
    index = bad_index / "model.safetensors.index.json"
    index.write_text('{"weight_map": {"a": "gone.safetensors"}}')
    assert main(["weights", str(golden), str(bad_index)]) == 2
    assert "gone.safetensors" in capsys.readouterr().err
    assert main(["weights", str(golden), str(golden), "-o", str(tmp_path / "bad.txt")]) == 2


def test_csv_report_has_msit_columns(
    golden: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "w.csv"
    assert main(["weights", str(golden), str(golden / "model.safetensors"), "-o", str(out)]) == 0
    header = out.read_text().splitlines()[0].split(",")
    assert header[:3] == ["weight_name", "golden_dtype", "golden_shape"]
    assert "relative_euclidean_distance" in header and header[-2:] == ["verdict", "reason"]


def test_dumped_weights_match_the_checkpoint(
    golden: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A layerwatch dump's weights (root.<param> names) against the checkpoint they came from,
    and msit's ``weights/`` of the same tiny model against that dump."""
    from layerwatch.capture import DumpConfig, register_hook

    torch.manual_seed(0)
    model = build().eval()
    config = DumpConfig(dump_path=str(tmp_path), dump_weight=True)
    with register_hook(model, config), torch.no_grad():
        model(torch.tensor([[11, 42, 7]]))
    code, obj = _run(capsys, str(golden), str(tmp_path))
    assert code == 0, obj.get("first_failure")
    assert obj["summary"]["compared"] >= 10
    assert {r["matched_by"] for r in obj["rows"]} == {"prefix"}
    msit = Path(__file__).parents[1] / "fixtures" / "msit" / "golden"
    code, obj = _run(capsys, str(msit), str(tmp_path))
    assert obj["summary"]["compared"] >= 10 and obj["summary"]["unmatched_golden"] == 0


def test_compare_root_cause_says_weights_differ(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A target whose down_proj weight was perturbed: ``compare`` blames the weights."""
    from layerwatch.capture import DumpConfig, register_hook

    for side, fault in (("g", False), ("t", True)):
        torch.manual_seed(0)
        model = build(fault=fault).eval()
        with register_hook(model, DumpConfig(dump_path=str(tmp_path / side))), torch.no_grad():
            model(torch.tensor([[11, 42, 7]]))
    code = main(["compare", str(tmp_path / "g"), str(tmp_path / "t")])
    out = capsys.readouterr().out
    assert code == 1
    cause = next(line for line in out.splitlines() if line.startswith("root cause"))
    assert "mlp.down_proj" in cause and "weights differ" in cause
    from layerwatch.engine.readers import open_dump
    from layerwatch.engine.session.findings import weights_differ

    topo = [open_dump(tmp_path / s).poll().topology for s in ("g", "t")]
    node = "root.model.layers.1.mlp.down_proj"
    assert weights_differ(*topo, node).startswith("weights differ: weight (norm ")
    assert weights_differ(*topo, "root.model.layers.1.mlp.up_proj") == ""


def _block_fp8(state: dict[str, torch.Tensor], block: int) -> dict[str, torch.Tensor]:
    """Hugging Face block-wise fp8 (DeepSeek-V3 / Qwen3-FP8): float8_e4m3fn weights and one
    ``weight_scale_inv`` per ``block`` × ``block`` tile, ``w ≈ q · scale_inv``."""
    out: dict[str, torch.Tensor] = {}
    for name, w in state.items():
        if w.ndim != 2 or not name.endswith("proj.weight"):
            out[name] = w
            continue
        rows, cols = -(-w.shape[0] // block), -(-w.shape[1] // block)
        w = w.float()
        scale = torch.empty(rows, cols)
        q = torch.empty_like(w)
        for i in range(rows):
            for j in range(cols):
                tile = w[i * block : (i + 1) * block, j * block : (j + 1) * block]
                s = tile.abs().max().clamp(min=1e-12) / 448
                scale[i, j] = s
                q[i * block : (i + 1) * block, j * block : (j + 1) * block] = tile / s
        out[name] = q.to(torch.float8_e4m3fn)
        out[name + "_scale_inv"] = scale
        out[name.removesuffix("weight") + "input_scale"] = torch.ones(())
    return out


def _with_block_config(golden: Path, target: Path, block: int) -> None:
    config = json.loads((golden / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "weight_block_size": [block, block],
    }
    (target / "config.json").write_text(json.dumps(config))


def test_block_fp8_passes_and_a_wrong_block_scale_fails(
    golden: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """16 × 16 blocks (config.json) on 32 × 64 weights: several blocks a tensor, so one block's
    scale off by 5 % is one tensor's failure, named; scales and input scales are consumed."""
    state = _block_fp8(_state(golden), 16)
    target = _save(tmp_path, state)
    _with_block_config(golden, target, 16)
    code, obj = _run(capsys, str(golden), str(target))
    assert code == 0, obj["first_failure"]
    assert obj["summary"]["unmatched_target"] == 0
    assert "fp8" in {r["kind"] for r in obj["rows"]}
    scale = state[DOWN + "_scale_inv"].clone()
    scale[1, 2] *= 1.3  # one 16 × 16 tile of 32: a ~1 % norm error of the tensor
    state[DOWN + "_scale_inv"] = scale
    _save(tmp_path, state)
    code, obj = _run(capsys, str(golden), str(target))
    assert code == 1 and obj["failures"] == [DOWN], obj["rows"]


def test_block_fp8_default_128_blocks_and_ragged_edges(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No config.json: 128 × 128 blocks; a 300 × 200 weight has ragged last blocks (3 × 2
    scales); a scale grid that does not tile the weight is an error row, never a guess."""
    torch.manual_seed(3)
    w = torch.randn(300, 200) * 0.02
    golden = tmp_path / "g.safetensors"
    save_file({"lin.weight": w}, str(golden))
    q = _block_fp8({"lin.proj.weight": w}, 128)
    target = tmp_path / "t.safetensors"
    save_file(
        {
            "lin.weight": q["lin.proj.weight"],
            "lin.weight_scale_inv": q["lin.proj.weight_scale_inv"],
        },
        str(target),
    )
    assert q["lin.proj.weight_scale_inv"].shape == (3, 2)
    code, obj = _run(capsys, str(golden), str(target))
    assert code == 0, obj["rows"]
    assert (
        obj["rows"][0]["kind"] == "fp8" and obj["rows"][0]["metrics"]["cosine_similarity"] > 0.999
    )
    bad = tmp_path / "bad.safetensors"
    save_file(
        {"lin.weight": q["lin.proj.weight"], "lin.weight_scale_inv": torch.ones(2, 2)}, str(bad)
    )
    code, obj = _run(capsys, str(golden), str(bad))
    assert code == 1 and obj["rows"][0]["verdict"] == "error"
    assert "does not tile" in obj["rows"][0]["reason"]


def test_user_thresholds_apply_to_weights(
    golden: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--thresholds``: a looser [weights.int8] lets a 3 % scale error pass, a stricter one
    fails the correct conversion, a bad table is one line and exit 2."""
    state = _int8(_state(golden))
    state[DOWN + "_scale"] = state[DOWN + "_scale"] * 1.03
    target = _save(tmp_path, state)
    assert _run(capsys, str(golden), str(target))[0] == 1
    loose = tmp_path / "loose.toml"
    loose.write_text(
        "[weights.int8]\ncosine_similarity = 0.99\nrelative_euclidean_distance = 0.2\n"
        "norm_relative_error = 0.05\n"
    )
    code, obj = _run(capsys, str(golden), str(target), "--thresholds", str(loose))
    assert code == 0, obj["first_failure"]
    strict = tmp_path / "strict.toml"
    strict.write_text("[weights.int8]\nrelative_euclidean_distance = 1e-6\n")
    (tmp_path / "clean").mkdir()
    clean = _save(tmp_path / "clean", _int8(_state(golden)))
    code, obj = _run(capsys, str(golden), str(clean), "--thresholds", str(strict))
    assert code == 1 and "relative_euclidean_distance" in obj["first_failure"]["reason"]
    bad = tmp_path / "bad.toml"
    bad.write_text("[weights.int9]\ncosine_similarity = 0.9\n")
    assert main(["weights", str(golden), str(clean), "--thresholds", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "weights.int9" in err and "Traceback" not in err


def test_many_damaged_shards_do_not_bury_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every damaged shard is a note; the text summary shows the first eight and how many more
    (as ``compare``'s does), ``--json`` keeps them all."""
    torch.manual_seed(0)
    model = build()
    model.save_pretrained(tmp_path / "g", max_shard_size="4KB")
    model.save_pretrained(tmp_path / "t", max_shard_size="4KB")
    shards = sorted((tmp_path / "t").glob("*.safetensors"))
    assert len(shards) >= 12
    for shard in shards[:11]:
        shard.write_bytes(shard.read_bytes()[:64])  # cut inside the header
    code = main(["weights", str(tmp_path / "g"), str(tmp_path / "t"), "--json"])
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert code == 1 and len(notes) >= 11
    main(["weights", str(tmp_path / "g"), str(tmp_path / "t")])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: ")]
    assert lines[:8] == [f"note: {n}" for n in notes[:8]]
    assert lines[8:] == [f"note: … {len(notes) - 8} more"]
