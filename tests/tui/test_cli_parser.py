"""``main`` builds only the sub-parser of the command it runs (tui/cli.py ``build_parser``):
that command's parse, help and usage errors are the whole parser's."""

from __future__ import annotations

import contextlib
import io

import pytest
from layerwatch.tui.cli import _COMMAND_PARSERS, build_parser


def _run(parser_for: str | None, argv: list[str]) -> tuple[object, str, str]:
    out, err = io.StringIO(), io.StringIO()
    result: object = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            result = vars(build_parser(parser_for).parse_args(argv))
        except SystemExit as exc:
            result = exc.code
    return result, out.getvalue(), err.getvalue()


def test_only_the_named_command_is_built() -> None:
    sub = build_parser("compare")._subparsers._group_actions[0]  # type: ignore[union-attr]
    assert list(sub.choices) == ["compare"]
    whole = build_parser()._subparsers._group_actions[0]  # type: ignore[union-attr]
    assert list(whole.choices) == list(_COMMAND_PARSERS)


@pytest.mark.parametrize(
    "argv",
    [
        ["compare", "g", "t", "--json", "--jobs", "1", "--tokens", "0-3"],
        ["compare", "--help"],
        ["compare", "g"],
        ["compare", "g", "t", "--bogus"],
        ["compare", "g", "t", "--jobs", "x"],
        *([command, "--help"] for command in _COMMAND_PARSERS),
    ],
)
def test_a_command_parses_helps_and_errs_as_with_every_command(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    alone = _run(argv[0], argv)
    assert alone == _run(None, argv)
    assert alone[1] or alone[2] or isinstance(alone[0], dict)
