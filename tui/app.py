"""The Textual app: drains the source's result queue on a timer and shows the grid.

Threads never touch widgets: the engine fills ``source.sink`` from its own thread, one
10-20 Hz timer here drains it and applies a whole tick's cells in one vectorised call (a
queue drained by a timer applied 20 000 cells in 36 ms where per-cell messages froze the UI
for 1.5 s). Drill-down queries run in thread workers that post messages back.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import ClassVar

from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.seam import CasesView, ComparisonSource
from textual.app import App, SystemCommand
from textual.screen import Screen

from . import keys, strips
from .grid_model import GridModel
from .screens.main import MainScreen
from .state import RunState

TICK_HZ = 15
"""Result batches are applied this often: fast enough to look live, slow enough for SSH."""
MAX_NOTES_PER_TICK = 3


def keep_process_pools_working() -> None:
    """Start multiprocessing's resource tracker now, while ``sys.stderr`` is a real file.

    While the app runs, Textual swaps ``sys.stderr`` for an object whose ``fileno()`` is -1;
    the resource tracker, started lazily by the first process pool the engine creates, passes
    ``sys.stderr.fileno()`` to its child and fails ("bad value(s) in fds_to_keep"). That killed
    the live pipeline's worker in ``layerwatch open`` (the grid stayed empty). Idempotent.
    """
    try:
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
    except Exception:  # no resource tracker on this platform: nothing to protect
        pass


class LayerwatchApp(App[int]):
    CSS_PATH = Path(__file__).with_name("layerwatch.tcss")
    HORIZONTAL_BREAKPOINTS: ClassVar = [(0, "-narrow"), (120, "-wide")]
    BINDINGS: ClassVar = keys.bindings("app")

    def __init__(
        self,
        source: ComparisonSource | None,
        *,
        title: str = "layerwatch",
        tick_hz: float = TICK_HZ,
        color_system: str | None = None,
        cases: CasesView | None = None,
    ) -> None:
        strips.install()  # every strip of the app builds only the caches it uses
        super().__init__()
        keep_process_pools_working()
        self._color_system = color_system
        self.source = source
        self.title_text = title
        self.title = title
        self._base_title = title
        self.tick_hz = tick_hz
        self.model = GridModel()
        self.model.verdict_only = bool(
            getattr(getattr(source, "view", None), "verdict_only", False)
        )
        self.state = RunState()
        self.error: str | None = None
        """A start-up problem to print after the terminal is restored."""
        self.main_screen: MainScreen | None = None
        self.cases = cases
        """Several cases (prompts) in one dump pair: the cases list comes first and ``source``
        is the case whose grid is open."""
        self.rank: int | None = None
        """The rank the grid shows (tensor parallel dumps); ``None``: the worst over ranks."""
        self.ranks: tuple[int, ...] = ()
        """The ranks seen, once the rank selector asked."""

    @property
    def color_system(self) -> str | None:
        """The terminal's colour system (``truecolor``, ``256``, ``standard``) unless fixed
        by the caller: snapshot tests fix it so the palette does not depend on ``$TERM``."""
        return self._color_system or self.console.color_system

    def on_mount(self) -> None:
        if self.color_system == "standard":
            self.theme = "ansi-dark"
        if self.cases is not None:
            from .screens.cases import CasesScreen

            self.push_screen(CasesScreen(self.cases))
            self.set_interval(1 / self.tick_hz, self.drain, name="drain")
            return
        try:
            self.source.start()
        except Exception as exc:  # LayerwatchError and friends: report after the UI is gone
            self.error = str(exc) or type(exc).__name__
            self.exit(2)
            return
        self.main_screen = MainScreen()
        self.push_screen(self.main_screen)
        self.drain()
        self.set_interval(1 / self.tick_hz, self.drain, name="drain")

    def open_case(self, key: str) -> None:
        """Show case ``key``'s grid: its own source, a fresh model and state, a new main screen."""
        assert self.cases is not None
        try:
            source = self.cases.source(key)
        except LayerwatchError as exc:
            self.notify(str(exc), severity="warning", timeout=5, markup=False)
            return
        self.source = source
        self.model, self.state = GridModel(), RunState()
        self.title = self.title_text = f"{self._base_title} · case {key}"
        source.start()
        self.main_screen = MainScreen()
        self.push_screen(self.main_screen)
        self.drain()

    def back_to_cases(self) -> None:
        """Esc on a case's grid: back to the list (the case stays compared for next time)."""
        if self.main_screen is not None and self.screen is self.main_screen:
            self.main_screen = None
            self.title = self.title_text = self._base_title
            self.pop_screen()

    def drain(self) -> None:
        """Apply everything the engine produced since the last tick (the only model writer)."""
        if self.source is None:  # the cases list, no case opened yet
            return
        batches = self.source.sink.drain()
        if not batches:
            return
        tick = self.state.merge(batches)
        model = self.model
        if tick.blocks is not None:
            model.set_blocks(tick.blocks)
        changed = model.apply(tick.cells if self.rank is None else [])
        first = self.state.first_failure
        moved = model.set_first_bad(
            (first.token, first.block) if first and first.block >= 0 else None
        )
        parted = self.state.divergence
        moved += model.set_parting(parted.token if parted is not None else None)
        if self.main_screen is not None and self.main_screen.is_mounted:
            self.main_screen.apply_tick(tick, changed, moved)
            if self.rank is not None and tick.cells:  # one rank shown: recolour it off-thread
                self.main_screen.load_rank(stepped=False)
        for note in tick.notes[:MAX_NOTES_PER_TICK]:
            self.notify(note, timeout=6, markup=False)

    @property
    def exit_code(self) -> int:
        """0 when everything compared so far passed, 1 when a failure was found (like compare)."""
        if self.cases is not None:
            return 1 if self.cases.failing or self.state.failed else 0
        return 1 if self.state.failed else 0

    # --- actions and the command palette ---------------------------------------------------
    def action_help(self) -> None:
        from .screens.help import HelpScreen

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    async def action_quit(self) -> None:
        self.exit(self.exit_code)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        scopes = {
            "MainScreen": ("grid", "main", "app"),
            "BlockScreen": ("block", "app"),
            "OperatorScreen": ("operator", "app"),
            "CasesScreen": ("cases", "app"),
        }.get(type(screen).__name__, ("app",))
        for action in keys.palette_actions(scopes, scan=self.model.verdict_only):
            yield SystemCommand(
                action.help,
                f"key: {keys.key_text(action)}",
                partial(self._palette_run, screen, action),
            )
        yield from super().get_system_commands(screen)

    def _palette_run(self, screen: Screen, action: keys.Action) -> None:
        if action.scope == "app":
            target = self
        elif action.scope == "grid":
            target = screen.query_one("#grid")
        else:
            target = screen
        self.call_later(target.run_action, action.name)


def run_app(source: ComparisonSource | None, *, title: str, cases: CasesView | None = None) -> int:
    """Show a comparison until the user quits; stop the source; return compare's exit code.

    A source whose worker gave up (``source.error``) ends like the headless path: its one line
    (raised, so the command prints it with its name) and exit 2, whatever the grid showed."""
    app = LayerwatchApp(source, title=title, cases=cases)
    if hasattr(source, "freeze_heap"):  # a LivePipeline: no long GC pauses (engine/gc_tuning)
        source.freeze_heap = True
        source.share_gil = True  # keys answered while it loads (engine/live/gil_share.py)
    try:
        result = app.run()
    finally:
        if source is not None:
            source.stop()
        if cases is not None:
            cases.close()
    if app.error is not None:
        print(f"layerwatch: {app.error}", file=sys.stderr)
        return 2
    gave_up = getattr(source, "error", None) if cases is None else None
    if gave_up:  # the comparison did not finish: not a verdict
        raise LayerwatchError(gave_up)
    if result is None:  # the app crashed: Textual has printed the traceback
        return app.return_code or 2
    return int(result)
