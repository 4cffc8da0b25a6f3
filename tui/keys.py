"""One action registry: it drives the key bindings, the Footer, the command palette and help.

Each screen (and the grid) asks for its bindings with :func:`bindings`; the help screen and
the palette read the same list, so a key can never be documented but unbound, or bound but
undocumented.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding


@dataclass(frozen=True, slots=True)
class Action:
    name: str
    """Method ``action_<name>`` on the widget or screen of :attr:`scope`."""
    keys: str
    """Textual key names, comma-separated (first one is shown)."""
    label: str
    """Footer text: a word or two."""
    help: str
    """One line for the help screen and the command palette."""
    scope: str
    """``grid``, ``main``, ``block``, ``operator``, ``cases``, ``help`` or ``app``."""
    show: bool = True
    key_display: str | None = None
    palette: bool = True
    compare_only: bool = False
    """Means something only against a golden run (the parting step, a metric, a rank): the
    scan grid (one run, verdicts only) neither binds, lists nor documents it."""


ACTIONS: tuple[Action, ...] = (
    # The grid: moving the cursor (vi aliases).
    Action("cursor_up", "up,k", "up", "Previous token", "grid", False, "↑/k", False),
    Action("cursor_down", "down,j", "down", "Next token", "grid", False, "↓/j", False),
    Action("cursor_left", "left,h", "left", "Previous block", "grid", False, "←/h", False),
    Action("cursor_right", "right,l", "right", "Next block", "grid", False, "→/l", False),
    Action(
        "page_up",
        "pageup,ctrl+b",
        "page up",
        "Up one screen of tokens",
        "grid",
        False,
        "PgUp",
        False,
    ),
    Action(
        "page_down",
        "pagedown,ctrl+f",
        "page down",
        "Down one screen of tokens",
        "grid",
        False,
        "PgDn",
    ),
    Action("first_token", "g", "top", "First token (prefill)", "grid", False, "g"),
    Action("last_token", "G", "bottom", "Newest token", "grid", False, "G"),
    Action("first_column", "home", "home", "First block (embedding)", "grid", False, "Home"),
    Action("last_column", "end", "end", "Last block (logits)", "grid", False, "End"),
    Action(
        "open",
        "enter",
        "open",
        "Open the block: its operators at this token",
        "grid",
        True,
        "⏎",
        False,
    ),
    # The main screen: verbs.
    Action("first_failure", "f", "first", "Jump to the first failure", "main"),
    Action("next_failure", "n", "next", "Next failing cell", "main"),
    Action("previous_failure", "N", "prev", "Previous failing cell", "main", False, "N"),
    Action(
        "parting",
        "d",
        "parts",
        "Jump to the step where the outputs part (the logits that chose another token)",
        "main",
        compare_only=True,
    ),
    Action(
        "cycle_metric",
        "m",
        "metric",
        "Colour by the next metric (cos, red, max_abs, mean_rel, local)",
        "main",
        compare_only=True,
    ),
    Action(
        "filter", "slash", "filter", "Filter columns by name (e.g. 'L1 norm')", "main", True, "/"
    ),
    Action(
        "cycle_rank",
        "r",
        "rank",
        "Tensor parallel: show one rank (cycles: worst of all ranks, rank 0, rank 1, …)",
        "main",
        False,
        compare_only=True,
    ),
    Action(
        "export", "e", "export", "Export the report (CSV or JSON, as compare writes it)", "main"
    ),
    Action(
        "toggle_follow",
        "space",
        "follow",
        "Pause/resume following the newest token",
        "main",
        False,
        "spc",
    ),
    Action(
        "clear_filter",
        "escape",
        "clear",
        "Clear the column filter (with no filter: back to the cases list)",
        "main",
        False,
        "esc",
        False,
    ),
    # The cases list (a dump pair with several cases).
    Action("open_case", "enter", "open", "Open this case's grid", "cases", True, "⏎", False),
    Action("next_failure", "n", "next", "Next failing case", "cases"),
    Action("previous_failure", "N", "prev", "Previous failing case", "cases", False, "N"),
    # Drill-down screens.
    Action(
        "back",
        "escape",
        "back",
        "Back up one level (the cursor is kept)",
        "block",
        True,
        "esc",
        False,
    ),
    Action("cursor_down", "j", "down", "Next operator", "block", False, "↓/j", False),
    Action("cursor_up", "k", "up", "Previous operator", "block", False, "↑/k", False),
    Action("next_failure", "n", "next", "Next failing operator", "block"),
    Action("previous_failure", "N", "prev", "Previous failing operator", "block"),
    Action("back", "escape", "back", "Back to the block view", "operator", True, "esc", False),
    Action("scroll_down", "j", "down", "Scroll down", "operator", False, "↓/j", False),
    Action("scroll_up", "k", "up", "Scroll up", "operator", False, "↑/k", False),
    # Everywhere.
    Action(
        "help",
        "question_mark,f1",
        "help",
        "Show the keys and what the colours mean",
        "app",
        True,
        "?",
    ),
    Action("quit", "q", "quit", "Quit (stops launched runs cleanly)", "app"),
)

SCOPE_TITLES = {
    "grid": "Grid: moving",
    "main": "Grid: finding failures",
    "block": "Block view (operators at one token)",
    "operator": "Operator view",
    "cases": "Cases list (several prompts in one dump)",
    "app": "Everywhere",
}


COMPARE_ONLY = frozenset(a.name for a in ACTIONS if a.compare_only)
"""Action names the scan grid turns off (``MainScreen.check_action``)."""


def actions(scope: str, *, scan: bool = False) -> list[Action]:
    """The actions of ``scope``; ``scan``: only those that mean something without a golden."""
    return [a for a in ACTIONS if a.scope == scope and not (scan and a.compare_only)]


def bindings(scope: str) -> list[Binding]:
    """Textual bindings for one scope, with the registry's Footer labels."""
    return [
        Binding(
            a.keys, a.name, a.label, show=a.show, key_display=a.key_display, id=f"{scope}.{a.name}"
        )
        for a in actions(scope)
    ]


def palette_actions(scopes: tuple[str, ...], *, scan: bool = False) -> list[Action]:
    """Actions offered in the command palette for the screens in ``scopes`` (``scan``: the
    scan grid's, without the compare-only ones)."""
    seen: set[str] = set()
    found = []
    for a in ACTIONS:
        if scan and a.compare_only:
            continue
        if a.scope in scopes and a.palette and (a.scope, a.name) not in seen:
            seen.add((a.scope, a.name))
            found.append(a)
    return found


def key_text(action: Action) -> str:
    """How the help screen writes the keys: ``↓/j``, ``N``, ``?/F1``."""
    if action.key_display:
        return action.key_display
    return "/".join(
        k.replace("question_mark", "?").replace("f1", "F1") for k in action.keys.split(",")
    )
