"""DumpConfig: msit's parameter names and meanings, validated with one-line errors."""

from __future__ import annotations

import pytest
import torch
from layerwatch.capture import DumpConfig
from layerwatch.capture.errors import LayerwatchError


def test_defaults_dump_every_token_both_parts_with_statistics(tmp_path):
    cfg = DumpConfig(dump_path=tmp_path)
    assert 0 in cfg.tokens and 10_000 in cfg.tokens  # all tokens (msit: prefill only)
    assert cfg.want_inputs and cfg.want_outputs and cfg.want_payload and cfg.want_stats
    assert cfg.format == "layerwatch"


@pytest.mark.parametrize(
    ("token_range", "inside", "outside"),
    [
        ([0, 1, 5], [0, 1, 5], [2, 6]),
        (range(2, 4), [2, 3], [1, 4]),
        ("0-2,7", [0, 2, 7], [3, 8]),
        ("5-", [5, 500], [4]),
    ],
)
def test_token_range_accepts_msit_list_range_and_spec(tmp_path, token_range, inside, outside):
    cfg = DumpConfig(dump_path=tmp_path, token_range=token_range)
    assert all(t in cfg.tokens for t in inside)
    assert not any(t in cfg.tokens for t in outside)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"tensor_part": 3}, "tensor_part"),
        ({"dump_statistics_mode": -1}, "dump_statistics_mode"),
        ({"format": "pth"}, "format"),
        ({"token_range": "3-1"}, "3-1"),
        ({"token_range": ["a"]}, "token_range"),
        ({"module_list": [torch.nn.Linear, "Linear"]}, "module_list"),
        ({"layer_name": 5}, "layer_name"),
        ({"mode": ["module", "api"]}, "api"),
        ({"device_id": -1}, "device_id"),
        ({"seed": "x"}, "seed"),
        ({"queue_bytes": 0}, "queue_bytes"),
        ({"dump_path": ""}, "dump_path"),
    ],
)
def test_bad_arguments_raise_one_line_errors(tmp_path, kwargs, needle):
    kwargs = {"dump_path": tmp_path, **kwargs}
    with pytest.raises(LayerwatchError) as info:
        DumpConfig(**kwargs)
    message = str(info.value)
    assert needle in message and "\n" not in message


def test_filters_glob_and_types(tmp_path):
    cfg = DumpConfig(
        dump_path=tmp_path,
        layer_name=["root.layers.[01].*", "root.norm"],
        module_list=[torch.nn.Linear, torch.nn.LayerNorm],
    )
    lin = torch.nn.Linear(2, 2)
    assert cfg.selects("root.layers.1.attention.wq", lin)
    assert not cfg.selects("root.layers.2.attention.wq", lin)
    assert not cfg.selects("root.layers.1.attention", torch.nn.ReLU())
    assert cfg.selects("root.norm", torch.nn.LayerNorm(2))


def test_dump_weights_alias_and_two_configs_are_independent(tmp_path):
    a = DumpConfig(dump_path=tmp_path / "a", dump_weights=True)
    b = DumpConfig(dump_path=tmp_path / "b", tensor_part=1)
    assert a.dump_weight and not b.dump_weight  # not a singleton (msit's is)
    assert a.path != b.path and a.tensor_part == 2
