"""The torch-free .pth reader: same values as torch.load(weights_only=True); hostile pickles refused."""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.readers.load import load_array
from layerwatch.engine.readers.pth import PthIncomplete, PthRefused, is_complete_zip, pth_locator

CASES = {
    "f32_transposed": lambda: torch.arange(12.0).reshape(3, 4).t(),
    "f64": lambda: torch.randn(3, 4, dtype=torch.float64),
    "f16": lambda: torch.randn(5, 2).half(),
    "bf16": lambda: torch.randn(7).bfloat16(),
    "i64_step_slice": lambda: torch.arange(20)[3:17:3],
    "i32": lambda: torch.arange(-5, 5, dtype=torch.int32),
    "i16": lambda: torch.arange(-5, 5, dtype=torch.int16),
    "i8": lambda: torch.arange(-5, 5, dtype=torch.int8),
    "u8": lambda: torch.arange(0, 250, 7, dtype=torch.uint8),
    "u16": lambda: torch.full((3,), 60000, dtype=torch.uint16),
    "u32": lambda: torch.full((2,), 4_000_000_000, dtype=torch.uint32),
    "u64": lambda: torch.full((2,), 2**63 + 5, dtype=torch.uint64),
    "bool_offset": lambda: torch.tensor([True, False, True, True])[1:],
    "c64": lambda: torch.randn(3, dtype=torch.complex64),
    "fp8": lambda: torch.randn(4).to(torch.float8_e4m3fn),
    "parameter": lambda: torch.nn.Parameter(torch.ones(2, 3)),
    "scalar": lambda: torch.tensor(3.5),
    "empty": lambda: torch.zeros(0, 3),
    "expanded": lambda: torch.randn(2, 3).expand(4, 2, 3),
    "column_slice": lambda: torch.randn(30, 40)[:, 5:9],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fast_path_equals_torch_load(tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.pth"
    torch.manual_seed(0)
    torch.save(CASES[name](), path)
    loc = pth_locator(path)
    ref = torch.load(path, weights_only=True).detach()
    if ref.dtype in (torch.bfloat16, torch.float8_e4m3fn):
        ref = ref.float()
    got = load_array(loc)
    assert got.shape == tuple(ref.shape)
    if ref.dtype in (torch.uint16, torch.uint32, torch.uint64):
        ref_np = ref.to(torch.int64).numpy() if ref.dtype != torch.uint64 else None
        if ref_np is not None:
            np.testing.assert_array_equal(got.astype(np.int64), ref_np)
        else:
            assert got.tolist() == [2**63 + 5] * 2
    else:
        np.testing.assert_array_equal(got, ref.numpy())
    assert loc.path == str(path) and loc.offset > 0


def test_legacy_format_falls_back_to_torch_weights_only(tmp_path: Path) -> None:
    path = tmp_path / "legacy.pth"
    t = torch.randn(4, 5).bfloat16()
    torch.save(t, path, _use_new_zipfile_serialization=False)
    loc = pth_locator(path)
    assert loc.path.endswith(".npy") and loc.dtype == "bfloat16"
    np.testing.assert_array_equal(load_array(loc), t.float().numpy())
    assert pth_locator(path) == loc  # cached


class _Hostile:
    """Unpickling this runs os.system — which must never happen."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


class _Exec:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (exec, (f"open({str(self.marker)!r}, 'w').write('x')",))


def _torch_zip_with(payload: bytes, path: Path) -> None:
    """A real torch zip file whose data.pkl is replaced by ``payload``."""
    good = io.BytesIO()
    torch.save(torch.ones(2), good)
    src = zipfile.ZipFile(io.BytesIO(good.getvalue()))
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = payload if info.filename.endswith("data.pkl") else src.read(info)
            dst.writestr(info.filename, data)


@pytest.mark.parametrize("kind", ["system", "exec", "write"])
def test_hostile_pickle_in_zip_is_refused_and_never_runs(tmp_path: Path, kind: str) -> None:
    marker = tmp_path / "pwned"
    if kind == "system":
        payload = pickle.dumps(_Hostile(marker), protocol=2)
    elif kind == "exec":
        payload = pickle.dumps(_Exec(marker), protocol=2)
    else:  # builtins.open via a plain global reference
        payload = b"cbuiltins\nopen\n(V" + str(marker).encode() + b"\nVw\ntR."
    path = tmp_path / "evil.pth"
    _torch_zip_with(payload, path)
    with pytest.raises(PthRefused) as err:
        pth_locator(path)
    message = str(err.value)
    assert "\n" not in message and "refused" in message
    assert not marker.exists()


def test_hostile_legacy_pickle_is_refused_by_the_fallback(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "evil_legacy.pth"
    path.write_bytes(pickle.dumps(_Hostile(marker), protocol=2))  # not a zip: fallback path
    with pytest.raises(LayerwatchError) as err:
        pth_locator(path)
    assert "weights_only" in str(err.value) and "\n" not in str(err.value)
    assert not marker.exists()


def test_a_pickle_of_something_else_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "dict.pth"
    _torch_zip_with(pickle.dumps({"a": 1}, protocol=2), path)
    with pytest.raises(PthRefused, match="not a single tensor"):
        pth_locator(path)


def test_truncated_zip_is_incomplete_not_an_error(tmp_path: Path) -> None:
    path = tmp_path / "t.pth"
    torch.save(torch.randn(1000), path)
    data = path.read_bytes()
    assert is_complete_zip(path)
    for cut in (10, len(data) // 2, len(data) - 10):
        path.write_bytes(data[:cut])
        assert not is_complete_zip(path)
        with pytest.raises(PthIncomplete):
            pth_locator(path)
    path.write_bytes(b"")
    assert not is_complete_zip(path)


def test_missing_file_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(LayerwatchError, match="not found"):
        pth_locator(tmp_path / "nope.pth")


def test_large_file_reads_only_headers(tmp_path: Path) -> None:
    """A multi-MB file: the locator points into the zip; values equal torch's."""
    path = tmp_path / "big.pth"
    t = torch.randn(600, 1000)
    torch.save(t, path)
    loc = pth_locator(path)
    assert loc.nbytes == t.numel() * 4
    np.testing.assert_array_equal(load_array(loc), t.numpy())
