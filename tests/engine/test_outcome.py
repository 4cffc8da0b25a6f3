"""engine/outcome.py: every front end ends the same way — report file by suffix, exit code.

Runs ``layerwatch compare`` and ``layerwatch open --headless`` in subprocesses on the dumps msit
8.2.0 wrote itself (tests/fixtures/msit: a tiny HF Llama, the target with noise in layer 1).
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from layerwatch.engine.report import CSV_COLUMNS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "msit"
GOLDEN = FIXTURES / "golden" / "msit_dump_fixture"
TARGET = FIXTURES / "target" / "msit_dump_fixture"
FRONT_ENDS = {"compare": ("compare",), "open": ("open", "--headless")}


def layerwatch(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "layerwatch.tui", *map(str, args), "--jobs", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """Each front end's ``-o`` report in each format, plus compare's ``--json`` stdout."""
    out = tmp_path_factory.mktemp("reports")
    written = {}
    for name, command in FRONT_ENDS.items():
        for suffix in ("csv", "json", "jsonl"):
            path = out / f"{name}.{suffix}"
            done = layerwatch(*command, GOLDEN, TARGET, "-o", path)
            assert done.returncode == 1, done.stderr  # the planted fault
            written[name, suffix] = path
    stdout = layerwatch("compare", GOLDEN, TARGET, "--json")
    (out / "stdout.json").write_text(stdout.stdout)
    written["compare", "stdout"] = out / "stdout.json"
    return written


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_dash_o_csv_is_csv(reports: dict[tuple[str, str], Path], front_end: str) -> None:
    with open(reports[front_end, "csv"], newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == list(CSV_COLUMNS) and len(rows) > 100


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_dash_o_json_is_the_json_object(
    reports: dict[tuple[str, str], Path], front_end: str
) -> None:
    report = json.loads(reports[front_end, "json"].read_text())
    assert report == json.loads(reports["compare", "stdout"].read_text())
    assert report["first_failure"] is not None and report["summary"]["fail"] > 0


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_dash_o_jsonl_is_one_row_a_line_then_the_summary(
    reports: dict[tuple[str, str], Path], front_end: str
) -> None:
    lines = reports[front_end, "jsonl"].read_text().splitlines()
    whole = json.loads(reports["compare", "stdout"].read_text())
    assert [json.loads(line) for line in lines[:-1]] == whole.pop("rows")
    assert json.loads(lines[-1]) == whole


@pytest.mark.parametrize("suffix", ["csv", "json", "jsonl"])
def test_both_front_ends_write_the_same_bytes(
    reports: dict[tuple[str, str], Path], suffix: str
) -> None:
    assert reports["compare", suffix].read_bytes() == reports["open", suffix].read_bytes()


@pytest.mark.parametrize("front_end", FRONT_ENDS)
@pytest.mark.parametrize("name", ["report.txt", "report", "report.csv.gz"])
def test_an_unknown_suffix_is_one_line_exit_2_before_any_work(
    tmp_path: Path, front_end: str, name: str
) -> None:
    done = layerwatch(*FRONT_ENDS[front_end], GOLDEN, TARGET, "-o", tmp_path / name)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"layerwatch {front_end}: cannot write ")
    assert ".csv, .json, .jsonl or .parquet" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("golden", "target", "code"),
    [(GOLDEN, GOLDEN, 0), (GOLDEN, TARGET, 1), (GOLDEN, "{tmp}/missing", 2)],
)
def test_compare_and_open_headless_exit_alike(
    tmp_path: Path, golden: Path, target: Path | str, code: int
) -> None:
    target = str(target).format(tmp=tmp_path)
    codes = {name: layerwatch(*cmd, golden, target).returncode for name, cmd in FRONT_ENDS.items()}
    assert codes == {"compare": code, "open": code}


def test_the_tuis_export_goes_the_same_way(
    tmp_path: Path, reports: dict[tuple[str, str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``e`` in the TUI calls ``LivePipeline.export``: same formats, same refusal.

    The pipeline runs in this process, where earlier tests may have loaded the compiled kernel;
    its float64 sums can differ from the numpy path's in the last digit (a logits row's mean
    relative error), and the front ends' fresh processes never load it for this small dump.
    So the kernel is set aside here, as in a fresh process."""
    from layerwatch.capture.errors import LayerwatchError
    from layerwatch.engine.live.pipeline import LivePipeline, attach_spec
    from layerwatch.engine.numerics import fused
    from layerwatch.engine.session.core import CompareSession

    monkeypatch.setitem(fused._STATE, "kernel", None)
    monkeypatch.setitem(fused._STATE, "seen", 0)

    pipeline = LivePipeline(
        attach_spec(GOLDEN, idle_s=0, watch=False),
        attach_spec(TARGET, idle_s=0, watch=False),
        session=CompareSession(jobs=1),
    )
    pipeline.start()
    try:
        assert pipeline.wait(60)
    finally:
        pipeline.stop()
    written = pipeline.export(str(tmp_path / "r.jsonl"))
    assert Path(written).read_bytes() == reports["open", "jsonl"].read_bytes()
    with pytest.raises(LayerwatchError, match=r"\.csv, \.json, \.jsonl or \.parquet"):
        pipeline.export(str(tmp_path / "r.txt"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl"]


def test_a_front_ends_own_notes_are_capped_under_the_summary() -> None:
    """``conclude``'s caller's notes (the live pipeline's) go under the summary capped as the
    session's are (``wording.note_lines``): hundreds of them must not bury it."""
    import io

    from layerwatch.engine.outcome import conclude
    from support.sessions import compare_dumps

    session = compare_dumps(GOLDEN, TARGET, jobs=1)
    out = io.StringIO()
    notes = [f"golden: note {i}" for i in range(12)]
    code = conclude(
        session, out, output=None, as_json=False, empty="-", summary_with_report=True, notes=notes
    )
    lines = out.getvalue().splitlines()
    assert code == 1 and lines[0].startswith("first bad token")
    ours = [line for line in lines if line.startswith("note: golden: note")]
    assert ours == [f"note: {n}" for n in notes[:8]]
    assert lines[-1] == "note: … 4 more"


def test_a_note_said_many_times_is_one_line_with_its_count() -> None:
    """The same note from every token (a reader's per-line note) is one line, counted; the
    cap counts distinct notes (``wording.note_lines``)."""
    from layerwatch.engine.wording import note_lines

    notes = ["a: bad line", "b: cut", "a: bad line", *[f"c{i}" for i in range(8)], "a: bad line"]
    lines = note_lines(notes)
    assert lines[:2] == ["note: a: bad line (3 times)", "note: b: cut"]
    assert len(lines) == 9 and lines[-1] == "note: … 2 more"
    assert note_lines(["x", "y"]) == ["note: x", "note: y"]
