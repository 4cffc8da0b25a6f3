"""Make the README's screenshots from the real demo (no terminal needed).

    . .venv/bin/activate && python screenshots/make_screenshots.py [--size 120x34] [--out screenshots]

Runs ``layerwatch demo --dtype bf16`` (golden fp32 and a bf16 target with the kv_cache fault,
both launched through live capture) headless, waits until everything is compared, then saves
the main grid at the first failure, its block view, the failing operator's view and the help
screen as SVG (and the grid once more in 16 colours).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from layerwatch.tui.app import LayerwatchApp
from layerwatch.tui.demo import build_pipeline
from layerwatch.tui.screens.block import BlockScreen
from layerwatch.tui.screens.help import HelpScreen
from layerwatch.tui.screens.operator import OperatorScreen
from textual.pilot import Pilot


async def wait_until(pilot: Pilot, condition: Callable[[], object], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit("screenshots: timed out waiting for the demo")
        await pilot.pause(0.05)


async def shoot(out: Path, size: tuple[int, int], color_system: str, shots: list[str]) -> None:
    demo_args = argparse.Namespace(fault=None, dtype="bf16", new_tokens=None)
    with tempfile.TemporaryDirectory(prefix="layerwatch-shots-") as work:
        pipeline, fault = build_pipeline(demo_args, Path(work))
        title = f"layerwatch demo · {fault} · target bf16"
        app = LayerwatchApp(pipeline, title=title, color_system=color_system)
        try:
            async with app.run_test(size=size) as pilot:
                await wait_until(pilot, lambda: app.state.done)
                await pilot.pause(0.3)
                await pilot.press("f")
                await wait_until(pilot, lambda: app.screen.query_one("#summary").pairs is not None)
                await pilot.pause(0.2)
                app.save_screenshot(shots[0], path=str(out))
                if len(shots) == 1:
                    return
                await pilot.press("enter")
                await wait_until(
                    pilot, lambda: isinstance(app.screen, BlockScreen) and app.screen.rows
                )
                await pilot.pause(0.2)
                app.save_screenshot(shots[1], path=str(out))
                await pilot.press("enter")
                await wait_until(
                    pilot, lambda: isinstance(app.screen, OperatorScreen) and app.screen.detail
                )
                await pilot.pause(0.2)
                app.save_screenshot(shots[2], path=str(out))
                await pilot.press("escape", "escape", "question_mark")
                await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
                await pilot.pause(0.2)
                app.save_screenshot(shots[3], path=str(out))
        finally:
            pipeline.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="120x34", help="terminal size, COLSxROWS")
    parser.add_argument("--out", default=str(Path(__file__).parent), help="where the SVGs go")
    args = parser.parse_args()
    cols, rows = (int(n) for n in args.size.split("x"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    asyncio.run(
        shoot(out, (cols, rows), "truecolor", ["grid.svg", "block.svg", "operator.svg", "help.svg"])
    )
    asyncio.run(shoot(out, (80, 24), "standard", ["grid-80x24-16-colours.svg"]))
    for name in ("grid", "block", "operator", "help", "grid-80x24-16-colours"):
        print(out / f"{name}.svg")


if __name__ == "__main__":
    main()
