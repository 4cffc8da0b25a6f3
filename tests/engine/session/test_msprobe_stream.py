"""msprobe's ``dump.json`` read as a stream (engine/readers/msprobe_tokens.py) for ``compare``'s
windows: the report the whole read gives, byte for byte, in the layouts msprobe may leave
(no construct.json, ``dump_data_dir`` after ``data``, tiny read buffers), and a corrupt file is
one line and exit 2 with the rows already written kept, marked incomplete (a file cut short:
tests/engine/session/test_msprobe_cut.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from bench.bench_scale import write_msprobe_dump
from layerwatch.engine.readers import json_stream
from layerwatch.engine.session import windowed
from layerwatch.tui.cli import main
from support.scale import whole_run_report, windowed_report

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "msprobe"


def _synthetic(tmp: Path, tokens: int = 10) -> tuple[Path, Path]:
    write_msprobe_dump(tmp / "golden", tokens, 40, noise=0.0, seed=1)
    write_msprobe_dump(tmp / "target", tokens, 40, noise=1e-7, seed=2, faults=((3, 5), (6, 2)))
    return tmp / "golden", tmp / "target"


def _same_report(golden: Path, target: Path, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for suffix in (".csv", ".json"):
        whole_run_report(golden, target, tmp / f"whole{suffix}")
        code, windows = windowed_report(golden, target, tmp / f"windowed{suffix}", monkeypatch)
        assert code in (0, 1) and windows >= 2
        assert (tmp / f"windowed{suffix}").read_bytes() == (tmp / f"whole{suffix}").read_bytes()


def test_read_a_few_hundred_characters_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(json_stream, "BLOCK", 300)
    _same_report(*_synthetic(tmp_path), tmp_path, monkeypatch)


def test_without_construct_json_tokens_come_from_the_module_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No construct.json: which modules are top-level needs every module path first (a pass
    over the file that keeps only the paths), then the tokens as with it."""
    golden, target = _synthetic(tmp_path)
    for side in (golden, target):
        (side / "step0" / "proc0" / "construct.json").unlink()
    _same_report(golden, target, tmp_path, monkeypatch)


def test_payloads_in_dump_data_dir_written_after_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tensor dump whose payloads are not beside dump.json and whose ``dump_data_dir``
    comes after ``data`` in the file: looked up when the first payload is missing."""
    sides = []
    for name in ("tensor_golden", "tensor_target"):
        shutil.copytree(FIXTURES / name, tmp_path / name)
        rank = next((tmp_path / name / "step0").iterdir())
        moved = tmp_path / f"{name}-payloads"
        (rank / "dump_tensor_data").rename(moved)
        dump = json.loads((rank / "dump.json").read_bytes())
        data = dump.pop("data")
        dump.pop("dump_data_dir", None)
        (rank / "dump.json").write_text(
            json.dumps({**dump, "data": data, "dump_data_dir": str(moved)})
        )
        sides.append(tmp_path / name)
    _same_report(sides[0], sides[1], tmp_path, monkeypatch)


@pytest.mark.parametrize("damage", ["corrupt", "garbage after a cut"])
def test_a_corrupt_dump_json_is_one_line_and_keeps_the_rows(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    damage: str,
) -> None:
    """The target's dump.json with a byte changed two thirds in (or cut there and followed by
    other text: not a clean cut): the tokens before it are compared and written, then one line
    naming the file, exit 2, the report marked incomplete."""
    golden, target = _synthetic(tmp_path, tokens=12)
    dump = target / "step0" / "proc0" / "dump.json"
    text = dump.read_text()
    at = text.index('"output"', len(text) * 2 // 3)
    tail = text[at + 1 :] if damage == "corrupt" else "x"
    dump.write_text(text[:at] + "#" + tail)
    monkeypatch.setattr(windowed, "WINDOW_TENSORS", 40)  # a token a window
    out = tmp_path / "r.csv"
    code = main(["compare", str(golden), str(target), "-o", str(out), "--jobs", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert any(str(dump) in line and "truncated or corrupt" in line for line in err), err
    report = out.read_text().splitlines()
    assert report[-1].startswith("# incomplete:"), report[-1]
    tokens = {int(row.split(",")[0]) for row in report[1:-1]}
    assert 3 <= len(tokens) < 12, sorted(tokens)
