"""Windowed compare of every dump format: msit and ATB read a token directory at a time,
msprobe a token of its ``dump.json`` read as a stream; each gives the whole-run report byte for
byte, and its memory grows by far less a pair than a whole-run session's.

Dumps: the committed fixtures of the real tools (tests/fixtures/README.md) and synthetic dumps
of many tokens written in each tool's layout (tests/bench/bench_scale.py).
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from bench.bench_scale import (
    make_pair,
    run_compare,
    write_atb_dump,
    write_dump,
    write_msit_dump,
    write_msprobe_dump,
)
from layerwatch.engine.readers import open_dump
from layerwatch.engine.session.core import CompareSession
from layerwatch.tui.cli import main
from support.scale import whole_run_report, windowed_report

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def _synthetic(write: Callable[..., int], sub: str, **faults: object) -> Callable[[Path], tuple]:
    def make(tmp: Path) -> tuple[Path, Path]:
        write(tmp / "golden" / sub, 10, 40, noise=0.0, seed=1)
        write(tmp / "target" / sub, 10, 40, noise=1e-7, seed=2, faults=((3, 5), (6, 2)), **faults)
        return tmp / "golden", tmp / "target"

    return make


def _fixture(golden: str, target: str) -> Callable[[Path], tuple]:
    return lambda _tmp: (FIXTURES / golden, FIXTURES / target)


DUMPS = {
    "msit": _fixture("msit/golden/msit_dump_fixture", "msit/target/msit_dump_fixture"),
    "msit-stats": _fixture("msit/stats/msit_dump_fixture", "msit/golden/msit_dump_fixture"),
    "msprobe": _fixture("msprobe/tensor_golden", "msprobe/tensor_target"),
    "msprobe-stats": _fixture("msprobe/stats_golden", "msprobe/stats_target"),
    "atb": _fixture("atb/msit_dump_fixture", "atb/msit_dump_fixture"),
    "msit-10-tokens": _synthetic(write_msit_dump, "cpu_1", diverge_at=8),
    "atb-10-tokens": _synthetic(write_atb_dump, "."),
    "msprobe-10-tokens": _synthetic(write_msprobe_dump, "."),
    "layerwatch-vs-msit": lambda tmp: (
        _synthetic(write_dump, "cpu_1")(tmp)[0],
        _synthetic(write_msit_dump, "cpu_1")(tmp / "m")[1],
    ),
}


@pytest.mark.parametrize("suffix", [".csv", ".json"])
@pytest.mark.parametrize("name", list(DUMPS))
def test_each_format_compared_in_windows_writes_the_whole_run_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, suffix: str
) -> None:
    golden, target = DUMPS[name](tmp_path)
    whole_run_report(golden, target, tmp_path / f"whole{suffix}")
    code, windows = windowed_report(golden, target, tmp_path / f"windowed{suffix}", monkeypatch)
    assert code in (0, 1)
    assert windows >= 2  # the windowed path ran, a token (or less) at a time
    assert (tmp_path / f"windowed{suffix}").read_bytes() == (
        tmp_path / f"whole{suffix}"
    ).read_bytes()


def test_a_runs_elements_count_towards_the_kernel_whether_its_windows_fork_or_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiled metric kernel is loaded once a run's compared elements reach
    ``fused.MIN_ELEMS``, and its last digits differ from the numpy path's: so the count is kept
    where windows are dispatched, not in the forked children (whose counts never came back), and
    a run loads it at the same window whether ``--jobs`` (at ``0``: the box's load) forks or not;
    with the kernel loaded part-way through, the reports are the same."""
    from layerwatch.engine.numerics import fused
    from layerwatch.engine.session import windowed
    from layerwatch.engine.session.jobs import JobRunner

    golden, target = DUMPS["msit-10-tokens"](tmp_path)
    monkeypatch.setattr(windowed, "WINDOW_PAYLOAD", 1)  # a window a token
    monkeypatch.setattr(JobRunner, "MIN_PARALLEL_COST", 0.0)  # each forked, however small
    monkeypatch.delenv("LAYERWATCH_NO_NUMBA", raising=False)

    def run(jobs: str, min_elems: int) -> tuple[int, bool, bytes]:
        monkeypatch.setitem(fused._STATE, "kernel", None)
        monkeypatch.setitem(fused._STATE, "seen", 0)
        monkeypatch.setattr(fused, "MIN_ELEMS", min_elems)
        out = tmp_path / f"jobs{jobs}-{min_elems}.csv"
        assert main(["compare", str(golden), str(target), "-o", str(out), "--jobs", jobs]) == 1
        return fused._STATE["seen"], fused.loaded(), out.read_bytes()

    never = 1 << 62
    whole, _, _ = run("1", never)
    assert whole > 0 and run("2", never)[0] == whole  # every window counted here
    halfway = run("1", whole // 2)
    if fused._STATE["failed"]:
        pytest.skip("llvmlite is not installed")
    assert halfway[1] and halfway == run("2", whole // 2)


@pytest.mark.parametrize("suffix", [".csv", ".json"])
def test_windows_cut_by_bytes_read_the_next_while_forked_children_compare(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    """A window closes once its payloads reach ``WINDOW_PAYLOAD`` (here: every token), and each
    forked compare reads the next window meanwhile (``JobRunner.meanwhile``): same report."""
    from layerwatch.engine.session import windowed
    from layerwatch.engine.session.jobs import JobRunner

    golden, target = DUMPS["msit-10-tokens"](tmp_path)
    whole_run_report(golden, target, tmp_path / f"whole{suffix}")
    monkeypatch.setattr(windowed, "WINDOW_PAYLOAD", 1)
    monkeypatch.setattr(JobRunner, "MIN_PARALLEL_COST", 0.0)  # too small to pay: forked anyway
    forked: list[tuple[bool, bool]] = []  # (read-ahead set on entry, taken on exit)
    real = JobRunner._run_forked

    def spy(self: JobRunner, *args: object) -> object:
        had = self.meanwhile is not None
        out = real(self, *args)  # type: ignore[arg-type]
        forked.append((had, self.meanwhile is None))
        return out

    monkeypatch.setattr(JobRunner, "_run_forked", spy)
    out = tmp_path / f"windowed{suffix}"
    assert main(["compare", str(golden), str(target), "-o", str(out), "--jobs", "2"]) in (0, 1)
    assert len(forked) >= 9 and all(had and taken for had, taken in forked)
    assert out.read_bytes() == (tmp_path / f"whole{suffix}").read_bytes()


def _spy_alone(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """``JobRunner.alone`` wrapped: each call (a window compared ahead) adds the runner's
    ``jobs`` inside it to the list returned."""
    from layerwatch.engine.session.jobs import JobRunner

    alone: list[int] = []
    real_alone = JobRunner.alone

    def spy_alone(self: JobRunner) -> Iterator[None]:
        with real_alone(self):
            alone.append(self.jobs)
            yield

    monkeypatch.setattr(JobRunner, "alone", contextmanager(spy_alone))
    return alone


@pytest.mark.parametrize("suffix", [".csv", ".json"])
def test_a_small_next_window_is_compared_while_forked_children_compare_this_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    """A next window its runner would compare inline (``JobRunner.stays_inline``) is compared
    in the read-ahead, with no fork of its own, while the children compare the window before;
    its rows follow that window's: the report is the whole run's, byte for byte."""
    from layerwatch.engine.session import windowed
    from layerwatch.engine.session.jobs import JobRunner

    golden, target = DUMPS["msit-10-tokens"](tmp_path)  # diverges at token 8, faults at 3, 6
    whole_run_report(golden, target, tmp_path / f"whole{suffix}")
    monkeypatch.setattr(windowed, "WINDOW_PAYLOAD", 1)  # a window a token
    monkeypatch.setattr(JobRunner, "MIN_PARALLEL_COST", 0.0)  # each window forked...
    monkeypatch.setattr(JobRunner, "stays_inline", lambda self, g, t: True)  # ...or compared ahead
    alone = _spy_alone(monkeypatch)  # jobs inside each compare done ahead
    forks: list[int] = []
    real_fork = JobRunner._run_forked

    def spy_fork(self: JobRunner, *args: object) -> object:
        forks.append(self.jobs)
        return real_fork(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(JobRunner, "_run_forked", spy_fork)
    out = tmp_path / f"windowed{suffix}"
    assert main(["compare", str(golden), str(target), "-o", str(out), "--jobs", "2"]) == 1
    # windows alternate: forked (reading and comparing the next ahead), then taken as compared
    assert len(forks) == 5 and len(alone) == 5 and alone == [1] * 5
    assert out.read_bytes() == (tmp_path / f"whole{suffix}").read_bytes()


def test_a_next_window_is_compared_ahead_only_where_both_hold_no_more_than_a_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window a token (40 tensors, closed by its payload): under a window of 60 tensors
    each forked window's successor is read meanwhile but never compared ahead (the two windows'
    records and results would be more than one window may hold); under 100, every other
    window is compared ahead. The report is the whole run's either way."""
    from layerwatch.engine.session import windowed
    from layerwatch.engine.session.jobs import JobRunner

    golden, target = DUMPS["msit-10-tokens"](tmp_path)  # 40 tensors a token
    whole_run_report(golden, target, tmp_path / "whole.csv")
    monkeypatch.setattr(windowed, "WINDOW_PAYLOAD", 1)  # a window a token
    monkeypatch.setattr(JobRunner, "MIN_PARALLEL_COST", 0.0)  # each window forked...
    monkeypatch.setattr(JobRunner, "stays_inline", lambda self, g, t: True)  # ...or ahead
    alone = _spy_alone(monkeypatch)
    for limit, ahead in ((60, 0), (100, 5)):
        monkeypatch.setattr(windowed, "WINDOW_TENSORS", limit)
        alone.clear()
        out = tmp_path / f"windowed{limit}.csv"
        assert main(["compare", str(golden), str(target), "-o", str(out), "--jobs", "2"]) == 1
        assert len(alone) == ahead
        assert out.read_bytes() == (tmp_path / "whole.csv").read_bytes()


@pytest.mark.parametrize("fmt", ["msit", "atb", "msprobe"])
def test_memory_grows_by_far_less_a_pair_than_a_whole_run_session(tmp_path: Path, fmt: str) -> None:
    """Peak RSS of ``compare`` at 6 k and 18 k pairs: the growth over the extra pairs, a pair,
    is what each pair keeps (the first windows' working set, ~3 of 2 048 tensors, is in both).
    A whole-run session keeps ~6 KB a pair, the store ~200 B; msprobe's dump.json is read as a
    stream, a token at a time, like the others' token directories. Bytes, never seconds: CI
    machines are shared."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    peaks = []
    pairs = []
    for tokens in (6, 18):  # 1 000 tensors a token
        golden, target, n = make_pair(tmp_path, tokens, 1000, fmt=fmt)
        peaks.append(run_compare(golden, target, tmp_path / f"r{tokens}.csv").peak_rss)
        pairs.append(n)
    per_pair = (peaks[1] - peaks[0]) / (pairs[1] - pairs[0])
    assert per_pair < 1_500, (fmt, per_pair, peaks, pairs)


def test_ranks_read_at_different_paces_close_a_token_only_when_every_rank_passed_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 dumps ten times the tensors of rank 0, so its index is read ten times slower:
    a window holds a token only once rank 1 has read past it too (else its tensors of that
    token would come after the window and be compared without the golden spread over them)."""
    write_dump(tmp_path / "golden" / "rank0", 6, 400, noise=0.0, seed=1)
    write_dump(tmp_path / "target" / "rank0", 6, 40, noise=1e-7, seed=2)
    write_dump(tmp_path / "target" / "rank1", 6, 400, noise=1e-7, seed=3, faults=((2, 7),))
    golden, target = tmp_path / "golden", tmp_path / "target"
    whole_run_report(golden, target, tmp_path / "whole.json")
    code, windows = windowed_report(golden, target, tmp_path / "windowed.json", monkeypatch)
    assert code == 1 and windows >= 2
    assert (tmp_path / "windowed.json").read_bytes() == (tmp_path / "whole.json").read_bytes()


def test_a_per_case_compare_streams_the_report_the_cases_make_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per-case dumps: each case's records are built when its turn comes (from the index's
    columns; the dumps are never read whole) and its rows go out as it is judged; the files
    and stdout are what the cases compared whole give (the JSON object written at once,
    ``indent=1``)."""
    from layerwatch.capture import DumpConfig, case, register_hook
    from layerwatch.capture.demo import build_model, generate, make_prompt
    from layerwatch.engine.cases import compare_cases, report_object, spans
    from layerwatch.engine.report import CSV_COLUMNS, csv_row, json_row

    for name, fault, keys in (("g", None, "abc"), ("t", "rotary_swap", "abq")):
        model = build_model(fault=fault, layers=4)
        with register_hook(model, DumpConfig(dump_path=tmp_path / name)):
            for i, key in enumerate(keys):
                with case(key):
                    generate(model, make_prompt(6, seed=10 + i), 6 if i == 1 else 3)
    g, t = str(tmp_path / "g"), str(tmp_path / "t")
    updates = {
        s: open_dump(p, side=s).poll(None, final=True) for s, p in (("golden", g), ("target", t))
    }
    cases = compare_cases(updates, lambda: CompareSession(jobs=1, side_stats=True))
    rows = [{"case": c.key, **json_row(r)} for c in cases for r in c.results]
    assert rows and [c.verdict for c in cases] == ["pass", "fail", "unpaired", "unpaired"]
    obj = {**report_object(cases), "rows": rows}
    n = 0
    with io.StringIO() as text:
        writer = csv.writer(text, lineterminator="\n")
        writer.writerow(["case", *CSV_COLUMNS])
        for c in cases:
            for r in c.results:
                writer.writerow([c.key, *csv_row(r, n)])
                n += 1
        want = {
            ".csv": text.getvalue(),
            ".json": json.dumps(obj, indent=1) + "\n",
            ".jsonl": "".join(json.dumps(row) + "\n" for row in rows)
            + json.dumps({k: v for k, v in obj.items() if k != "rows"})
            + "\n",
        }
    from layerwatch.engine.readers.layerwatch import IndexTable, LayerwatchReader

    def whole_read(*args: object, **kwargs: object) -> None:
        raise AssertionError("a per-case compare read a dump whole")

    built: list[tuple[int, int]] = []
    records = IndexTable.records

    def counted(self: IndexTable, low: int, high: int) -> tuple[list, list[str]]:
        got = records(self, low, high)
        built.append((low, len(got[0])))
        return got

    monkeypatch.setattr(LayerwatchReader, "poll", whole_read)
    monkeypatch.setattr(IndexTable, "records", counted)
    for suffix, expected in want.items():
        out = tmp_path / f"r{suffix}"
        assert main(["compare", g, t, "-o", str(out), "--jobs", "1"]) == 1
        assert out.read_text() == expected, suffix
    capsys.readouterr()
    assert main(["compare", g, t, "--json", "--jobs", "1"]) == 1
    assert capsys.readouterr().out == want[".json"]
    # a case of a side at a time, each paired case once a run (unpaired ones never read)
    sizes = [
        sum(span.begin <= r.key.token < (span.end or 1 << 62) for r in update.tensors)
        for update in updates.values()
        for span in spans(update.case_marks)
    ]
    assert built and all(n in sizes for _, n in built), (built, sizes)
    assert len(built) == 4 * 4  # golden and target of cases a and b; three files and stdout


@pytest.mark.parametrize(
    ("write", "sub", "room"),
    [
        (write_msit_dump, "cpu_1", "160.25M"),
        (write_atb_dump, ".", "160.25M"),
        (write_msprobe_dump, ".", "160.25M"),
    ],
)
def test_the_memory_check_counts_each_formats_pairs_before_comparing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    write: Callable[..., int],
    sub: str,
    room: str,
) -> None:
    """msit and ATB: estimated from the first token's files (no record read); msprobe: its
    first token's tensors scaled by its dump.json's size (about the count: names grow a digit)."""
    for side in ("golden", "target"):
        write(tmp_path / side / sub, 20, 400, noise=0.0, seed=1)
    g, t = str(tmp_path / "golden"), str(tmp_path / "target")
    assert main(["compare", g, t, "--max-memory", room]) == 2
    err = capsys.readouterr().err.strip()
    about = re.search(r"about ([\d ]+) pairs", err)
    assert about is not None and "\n" not in err and "--tokens 0-" in err, err
    assert abs(int(about.group(1).replace(" ", "")) - 8_000) <= 8_000 * 0.05, err
    assert main(["compare", g, t, "--max-memory", "4G", "--jobs", "1"]) == 0
