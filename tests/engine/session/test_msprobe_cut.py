"""An msprobe ``dump.json`` cut short (what a run killed while msprobe wrote its step leaves):
the complete calls before the cut are compared — rows equal to the uncut run's for those pairs,
read as a stream (``compare``'s windows) or whole (``open``/``watch``, the live reader) — one
note names the file and where it ends, and the exit code comes from the findings; a file being
written is waited for, never reported cut (engine/readers/msprobe.py, json_stream.py)."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
from bench.bench_scale import write_msprobe_dump
from layerwatch.engine.readers import open_dump
from layerwatch.engine.session import windowed
from layerwatch.tui.cli import main
from support.scale import whole_run_report, windowed_report

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "msprobe"
TOKENS = 8


def _pair(tmp: Path, ranks: tuple[str, ...] = ("proc0",)) -> tuple[Path, Path]:
    """A golden and a target statistics dump of ``TOKENS`` tokens (two faults), a rank each."""
    for side, noise, seed, faults in (("golden", 0.0, 1, ()), ("target", 1e-7, 2, ((3, 5),))):
        write_msprobe_dump(tmp / side, TOKENS, 40, noise=noise, seed=seed, faults=faults)
        for rank in ranks[1:]:
            shutil.copytree(tmp / side / "step0" / "proc0", tmp / side / "step0" / rank)
    return tmp / "golden", tmp / "target"


def _call_ends(text: str) -> list[tuple[int, int]]:
    """(character where each call's text ends, its tensors) of a ``json.dumps`` dump.json."""
    out, at = [], 0
    for name, value in json.loads(text)["data"].items():
        piece = f"{json.dumps(name)}: {json.dumps(value)}"
        at = text.index(piece, at) + len(piece)
        out.append((at, len(value["input_args"]) + len(value["output"])))
    return out


CUTS = {
    "inside a call": lambda text: text.index('"Max"', len(text) // 2) + 9,
    "inside a name": lambda text: text.index('"Module.', len(text) // 3) + 5,
    "between calls": lambda text: text.index(', "Module.', len(text) // 2) + 1,
    "before the closing braces": lambda text: len(text) - 2,
}


def _rows(path: Path, cut_dir: str, whole_dir: str) -> dict[tuple[str, str], list[str]]:
    """Report rows by (token, data_id) with the target's path written as the uncut run's."""
    with path.open(newline="") as fh:
        rows = [r for r in csv.reader(fh) if r and not r[0].startswith("#")][1:]
    return {(r[0], r[1]): [c.replace(cut_dir, whole_dir) for c in r] for r in rows}


@pytest.mark.parametrize("where", sorted(CUTS))
def test_the_calls_before_the_cut_are_compared_with_one_note(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    golden, target = _pair(tmp_path)
    whole, _ = windowed_report(golden, target, tmp_path / "whole.csv", monkeypatch)
    cut = tmp_path / "cut"
    shutil.copytree(target, cut)
    dump = cut / "step0" / "proc0" / "dump.json"
    text = dump.read_text()
    at = CUTS[where](text)
    dump.write_text(text[:at])
    capsys.readouterr()

    code, windows = windowed_report(golden, cut, tmp_path / "cut.csv", monkeypatch)
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if "cut short" in line]
    assert len(notes) == 1 and str(dump) in notes[0] and f"character {at}," in notes[0], err
    assert "step0 proc0 is not compared" in notes[0]
    rows = _rows(tmp_path / "cut.csv", str(cut), str(target))
    paired = {k: r for k, r in rows.items() if r[24] != "unpaired"}
    uncut = _rows(tmp_path / "whole.csv", str(cut), str(target))
    want = sum(n for end, n in _call_ends(text) if end <= at)
    assert len(paired) == want > 0 and windows >= 2
    assert all(uncut[k] == r for k, r in paired.items())  # metrics, verdicts, reasons
    failed = any(r[24] in ("fail", "error") for r in paired.values())
    assert code == (1 if failed else 0) and whole == 1
    # read whole (the live reader's final read, as open/watch do): the same report
    whole_run_report(golden, cut, tmp_path / "whole-read.csv")
    assert (tmp_path / "whole-read.csv").read_bytes() == (tmp_path / "cut.csv").read_bytes()


def test_one_rank_cut_the_others_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ranks; rank 1's file cut a fifth in (more than half of all tensors unpaired): rank
    0 is compared whole, rank 1 up to the cut, the exit code is the findings'."""
    golden, target = _pair(tmp_path, ("proc0", "proc1"))
    dump = target / "step0" / "proc1" / "dump.json"
    text = dump.read_text()
    at = text.index('"Max"', len(text) // 5)
    dump.write_text(text[:at])
    monkeypatch.setattr(windowed, "WINDOW_TENSORS", 40)
    out = tmp_path / "r.json"
    code = main(["compare", str(golden), str(target), "-o", str(out), "--jobs", "1"])
    err = capsys.readouterr().err
    assert str(dump) in err and "cut short" in err and "proc0/dump.json" not in err
    summary = json.loads(out.read_text())["summary"]
    per_rank = sum(n for _, n in _call_ends(text))
    assert summary["pairs"] == per_rank + sum(n for end, n in _call_ends(text) if end <= at)
    assert code == 1  # the fault at token 3 of rank 0


def test_a_cut_tensor_dump_keeps_its_payloads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """msprobe's tensor task (``dump_tensor_data/*.pt``): the calls before the cut are compared
    from their payloads; ``--json`` and stderr."""
    for name in ("tensor_golden", "tensor_target"):
        shutil.copytree(FIXTURES / name, tmp_path / name)
    dump = next((tmp_path / "tensor_target" / "step0").iterdir()) / "dump.json"
    text = dump.read_text()
    dump.write_text(text[: text.index('"Module.', len(text) // 2) + 20])
    args = [str(tmp_path / "tensor_golden"), str(tmp_path / "tensor_target"), "--json"]
    code = main(["compare", *args])
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert "cut short" in err and str(dump) in err
    compared = [r for r in report["rows"] if r["verdict"] != "unpaired"]
    assert compared and report["summary"]["unpaired"] > 0
    assert code == (1 if report["first_failure"] else 0)


def test_an_empty_dump_json_is_nothing_to_compare(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden, target = _pair(tmp_path)
    (target / "step0" / "proc0" / "dump.json").write_text("")
    assert main(["compare", str(golden), str(target)]) == 2
    assert "nothing was compared" in capsys.readouterr().err


def test_a_file_being_written_is_waited_for_not_reported_cut(tmp_path: Path) -> None:
    """The live reader (``watch``/``open`` of a dump msprobe still writes): a partial file
    gives no tensor and no note until it is whole; only the final read of a file still cut
    keeps its complete calls and says so."""
    _, target = _pair(tmp_path)
    dump = target / "step0" / "proc0" / "dump.json"
    text = dump.read_text()
    dump.write_text(text[: len(text) // 2])
    reader = open_dump(target, side="target")
    first = reader.poll(None)
    assert not first.tensors and not first.notes
    dump.write_text(text)
    whole = reader.poll([dump])
    assert len(whole.tensors) == sum(n for _, n in _call_ends(text)) and not whole.notes

    dump.write_text(text[: len(text) // 2])
    again = open_dump(target, side="target")
    assert not again.poll(None).notes
    final = again.poll(None, final=True)
    assert [n for n in final.notes if "cut short" in n] and final.tensors


def test_construct_json_cut_short_reads_the_calls_it_places(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """construct.json (each call's parent) cut short beside a whole dump.json: the calls up to
    the first one it lacks are compared (its place in the tree, so its token and an API's
    name, is unknown past the cut), stream and whole reads alike, with one note naming it."""
    golden, target = _pair(tmp_path)
    construct = target / "step0" / "proc0" / "construct.json"
    text = construct.read_text()
    at = text.index('"Module.', len(text) // 2) + 7
    construct.write_text(text[:at])
    placed = set(json.loads(text[: text.rindex(",", 0, at)] + "}"))
    calls = json.loads((target / "step0" / "proc0" / "dump.json").read_text())["data"]
    first_lacking = next(i for i, name in enumerate(calls) if name not in placed)
    want = sum(
        len(v["input_args"]) + len(v["output"]) for v in list(calls.values())[:first_lacking]
    )
    capsys.readouterr()
    code, _ = windowed_report(golden, target, tmp_path / "cut.csv", monkeypatch)
    err = capsys.readouterr().err
    assert f"{construct}: cut short at character {at}, after {first_lacking} complete calls" in err
    rows = _rows(tmp_path / "cut.csv", "", "")
    assert len([r for r in rows.values() if r[24] != "unpaired"]) == want
    assert code == (1 if any(r[24] == "fail" for r in rows.values()) else 0)
    whole_run_report(golden, target, tmp_path / "whole-read.csv")
    assert (tmp_path / "whole-read.csv").read_bytes() == (tmp_path / "cut.csv").read_bytes()


UNUSABLE = {
    "empty": "",
    "not JSON": "xyz",
    "not an object": "[1, 2]",
    "cut before its first call": '{"Module.model',
}


@pytest.mark.parametrize("what", sorted(UNUSABLE))
def test_an_unusable_construct_json_is_read_as_none_with_one_note(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    what: str,
) -> None:
    """A construct.json that gives no parent (empty, corrupt from its start, not an object, cut
    before its first call): the dump is compared as if it had none — the same rows and exit
    code — with one note that names the file, read as a stream or whole."""
    golden, target = _pair(tmp_path)
    construct = target / "step0" / "proc0" / "construct.json"
    construct.unlink()
    code_none, _ = windowed_report(golden, target, tmp_path / "none.csv", monkeypatch)
    assert not [line for line in capsys.readouterr().err.splitlines() if "construct" in line]
    construct.write_text(UNUSABLE[what])

    code, _ = windowed_report(golden, target, tmp_path / "bad.csv", monkeypatch)
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if str(construct) in line]
    assert len(notes) == 1, err
    assert notes[0].endswith("; module parents are taken from dump.json's names")
    none = _rows(tmp_path / "none.csv", "", "")
    assert code == code_none == 1 and _rows(tmp_path / "bad.csv", "", "") == none
    # read whole (the live reader's final read, as open/watch do): the same rows and note
    whole = open_dump(target, side="target").poll(None, final=True)
    assert [n for n in whole.notes if str(construct) in n] == [notes[0].split("target: ", 1)[1]]
    whole_run_report(golden, target, tmp_path / "whole.csv")
    assert _rows(tmp_path / "whole.csv", "", "") == none
