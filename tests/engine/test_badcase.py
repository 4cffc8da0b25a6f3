"""``layerwatch badcase``: evaluation files in, bad cases with their first differing token out."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.badcase import analyze, first_difference
from layerwatch.engine.readers.evalcases import read_eval


def _csv(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def _jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _cli(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "layerwatch.tui", "badcase", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    """Four questions: 1 bad from token 2, 2 improved, 3 bad with equal outputs, 4 both pass."""
    golden = _csv(
        tmp_path / "golden.csv",
        ["key", "queries", "input_token_ids", "output_token_ids", "passed"],
        [
            [1, "2+2?", "[5, 6]", "[10, 11, 12, 13]", "Correct"],
            [2, "capital?", "[7]", "[20, 21]", "Wrong"],
            [3, "color?", "[8]", "[30]", "True"],
            [4, "name?", "[9]", "[40, 41]", "1"],
        ],
    )
    target = _jsonl(
        tmp_path / "target.jsonl",
        [
            {"key": "4", "queries": "name?", "pass": 1, "output_token_ids": [40, 41]},
            {"key": "1", "queries": "2+2?", "pass": "false", "output_token_ids": [10, 11, 99]},
            {"key": "2", "queries": "capital?", "pass": True, "output_token_ids": "[20, 22]"},
            {"key": "3", "queries": "color?", "pass": "wrong", "output_token_ids": [30]},
        ],
    )
    return golden, target


def test_bad_and_improved_cases_with_their_first_differing_token(runs: tuple[Path, Path]) -> None:
    report = analyze(read_eval(runs[0]), read_eval(runs[1]))
    assert [(p.golden.key, p.first_diff_token) for p in report.bad] == [("1", 2), ("3", None)]
    assert [(p.golden.key, p.first_diff_token) for p in report.improved] == [("2", 1)]
    out = report.to_json()
    assert out["summary"] == {
        "cases": 4,
        "bad": 2,
        "improved": 1,
        "golden_only": 0,
        "target_only": 0,
        "skipped_rows": 0,
    }
    assert out["first_failure"]["key"] == "1" and out["first_failure"]["first_diff_token"] == 2
    assert [r["key"] for r in out["rows"]] == ["1", "2", "3", "4"]  # golden file order


def test_cli_exit_codes_json_and_msit_csv_columns(runs: tuple[Path, Path], tmp_path: Path) -> None:
    report = tmp_path / "bad.csv"
    proc = _cli(*runs, "--json", "-o", report)
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert [c["key"] for c in data["bad_cases"]] == ["1", "3"]
    with report.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == [
        "key",
        "queries",
        "input_token_ids_golden",
        "input_token_ids_test",
        "output_token_ids_golden",
        "output_token_ids_test",
        "passed_golden",
        "passed_test",
        "first_diff_token",
        "kind",
    ]
    assert [(r["key"], r["first_diff_token"], r["kind"]) for r in rows] == [
        ("1", "2", "bad"),
        ("2", "1", "improved"),
        ("3", "", "bad"),
    ]
    clean = _cli(runs[0], runs[0])
    assert clean.returncode == 0 and "0 bad" in clean.stdout


def test_first_difference_rules() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 2]) == 2  # a prefix: the shorter length
    assert first_difference([1], [2]) == 0
    assert first_difference(None, [1]) is None


def test_merge_on_key_alone_when_one_side_has_no_queries(tmp_path: Path) -> None:
    golden = _csv(tmp_path / "g.csv", ["key", "queries", "passed"], [["a", "q", "True"]])
    target = _csv(tmp_path / "t.csv", ["key", "pass"], [["a", "False"]])
    report = analyze(read_eval(golden), read_eval(target))
    assert [p.golden.key for p in report.bad] == ["a"] and not report.with_queries


def test_rows_without_key_or_pass_value_are_skipped_and_counted(tmp_path: Path) -> None:
    golden = _csv(tmp_path / "g.csv", ["key", "passed"], [["a", "True"], ["b", ""], ["", "1"]])
    target = _csv(tmp_path / "t.csv", ["key", "passed"], [["a", "True"], ["b", "False"]])
    report = analyze(read_eval(golden), read_eval(target))
    assert report.skipped == 2 and len(report.pairs) == 1 and report.target_only == ("b",)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("cols.csv", "id,ok\n1,True\n", "missing column key and passed (found: id, ok"),
        ("flag.csv", "key,passed\n1,maybe\n", "flag.csv:2: pass value 'maybe'"),
        ("dup.csv", "key,passed\n1,True\n1,False\n", "dup.csv:3: duplicate key '1'"),
        ("ids.csv", 'key,passed,output_token_ids\n1,True,"[1, x]"\n', "is not a list of token ids"),
        ("cells.csv", "key,passed\n1,True,extra\n", "more cells than the header"),
        ("empty.csv", "", "empty CSV file"),
        (
            "torn.jsonl",
            '{"key": 1, "passed": true}\n{"key": 2, "pa\n{"key": 3}\n',
            "torn.jsonl:2: not a",
        ),
        ("flag-last.csv", "key,passed\n1,True\n2,maybe\n", "flag-last.csv:3: pass value 'maybe'"),
        ("list.json", '{"key": 1}', "expected a JSON array of objects"),
        ("cases.txt", "key,passed\n", "unknown evaluation file type"),
    ],
)
def test_malformed_input_is_one_line_and_exit_2(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    bad = tmp_path / name
    bad.write_text(text, encoding="utf-8")
    with pytest.raises(LayerwatchError, match=None) as info:
        read_eval(bad)
    assert message in str(info.value)
    good = _csv(tmp_path / "good.csv", ["key", "passed"], [["1", "True"]])
    proc = _cli(good, bad)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_different_datasets_are_unusable_not_clean(tmp_path: Path) -> None:
    golden = _csv(tmp_path / "g.csv", ["key", "passed"], [["1", "True"]])
    target = _csv(tmp_path / "t.csv", ["key", "passed"], [["2", "True"]])
    proc = _cli(golden, target)
    assert proc.returncode == 2 and "no case is in both files" in proc.stderr
    missing = _cli(golden, tmp_path / "nope.csv")
    assert missing.returncode == 2 and "no such evaluation file" in missing.stderr


def test_unknown_report_suffix_is_refused(runs: tuple[Path, Path], tmp_path: Path) -> None:
    proc = _cli(*runs, "-o", tmp_path / "report.xlsx")
    assert proc.returncode == 2 and "a report file ends in .csv, .json or .jsonl" in proc.stderr


def test_jsonl_report_is_one_case_a_line_then_the_summary(
    runs: tuple[Path, Path], tmp_path: Path
) -> None:
    out = tmp_path / "cases.jsonl"
    assert _cli(*runs, "-o", out).returncode == 1
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["key"] for r in lines[:-1]] == ["1", "2", "3", "4"]
    assert lines[-1]["summary"]["bad"] == 2 and lines[-1]["first_failure"]["key"] == "1"


@pytest.mark.parametrize(
    "name", ["cut.csv", "cut-in-ids.csv", "cut-before-pass.csv", "cut.jsonl", "cut-at-key.jsonl"]
)
def test_a_last_line_cut_short_is_left_out_with_a_note(runs: tuple[Path, Path], name: str) -> None:
    """An evaluation killed while it wrote its last line: the file ends without a newline in
    the middle of a row. Every row before it is compared as in the whole file; the cut row is
    named in one note (stdout's summary, stderr with --json); the exit code is the cases'."""
    golden, target = runs
    whole = json.loads(_cli(golden, target, "--json").stdout)
    text = golden.read_text() if name.endswith(".csv") else target.read_text()
    marks = {  # (text the cut follows, characters of it kept) on the last line
        "cut.csv": ("name?", 3),
        "cut-in-ids.csv": ('"[40, 4', 5),
        "cut-before-pass.csv": ('",1', 2),
        "cut.jsonl": ('"pass": "wrong"', 12),
        "cut-at-key.jsonl": ('{"key": "3"', 5),
    }
    mark, keep = marks[name]
    end = text.rindex(mark) + keep
    cut = golden.parent / name
    cut.write_text(text[:end], encoding="utf-8")
    args = (cut, target) if name.endswith(".csv") else (golden, cut)
    out = _cli(*args, "--json")
    assert "Traceback" not in out.stderr
    report = json.loads(out.stdout)
    line = text[:end].count("\n") + 1
    assert (
        out.stderr == f"note: {cut}:{line}: last line cut short (no newline at the end), skipped\n"
    )
    left_out = {r["key"] for r in whole["rows"]} - {r["key"] for r in report["rows"]}
    assert len(left_out) == 1
    assert [r for r in whole["rows"] if r["key"] not in left_out] == report["rows"]
    assert out.returncode == (1 if report["bad_cases"] else 0)
    text_out = _cli(*args)
    assert f"note: {cut}:{line}: last line cut short" in text_out.stdout
    assert text_out.returncode == out.returncode


@pytest.mark.parametrize(
    ("where", "kept"),
    [("inside the last object", 3), ("after a comma", 3), ("after an object", 3), ("at [", 0)],
)
def test_a_json_array_cut_short_keeps_its_complete_cases(
    runs: tuple[Path, Path], where: str, kept: int
) -> None:
    """An evaluation killed while it wrote its JSON array (no closing ``]``): the objects
    before the cut are compared as in the whole file, one note says where the file ends and
    how many cases it kept; nothing before the cut is lost."""
    golden, target = runs
    whole_path = target.with_name("whole.json")
    cases = [json.loads(line) for line in target.read_text().splitlines()]
    text = json.dumps(cases, indent=1)
    whole_path.write_text(text)
    whole = json.loads(_cli(golden, whole_path, "--json").stdout)
    last = text.rindex("{")
    ends = {
        "inside the last object": text.index('"pass"', last) + 3,
        "after a comma": text.rindex(",", 0, last) + 1,
        "after an object": text.rindex("}", 0, last) + 1,
        "at [": 1,
    }
    cut = target.with_name("cut.json")
    cut.write_text(text[: ends[where]] + "\n")
    out = _cli(golden, cut, "--json")
    assert "Traceback" not in out.stderr
    if not kept:  # nothing whole before the cut: nothing to compare
        assert out.returncode == 2 and out.stderr.count("\n") == 1
        return
    report = json.loads(out.stdout)
    note = f"{cut}: cut short at character {ends[where] + 1}, after {kept} complete cases"
    assert out.stderr.startswith(f"note: {note}; the rest of the file is not compared"), out.stderr
    kept_keys = {c["key"] for c in cases[:kept]}
    assert [r for r in whole["rows"] if r["key"] in kept_keys] == report["rows"]
    assert len(report["rows"]) == kept
    assert out.returncode == (1 if report["bad_cases"] else 0)
    corrupt = target.with_name("corrupt.json")  # closed, but not JSON: still unusable
    corrupt.write_text(text[: ends["after a comma"]] + "]")
    bad = _cli(golden, corrupt)
    assert bad.returncode == 2 and "not JSON" in bad.stderr


def test_a_json_array_without_a_final_newline_is_whole(tmp_path: Path) -> None:
    """``json.dump`` writes no newline at the end: a JSON array that parses is whole, so its
    last case's bad pass value is still one line, exit 2 — not a cut line left out."""
    path = tmp_path / "eval.json"
    path.write_text('[{"key": "a", "passed": true}, {"key": "b", "passed": "maybe"}]')
    with pytest.raises(LayerwatchError, match=r"eval\.json:2: pass value 'maybe'"):
        read_eval(path)
