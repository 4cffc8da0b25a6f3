"""The engine may start process pools while the app runs; Textual's stderr swap must not break them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import asyncio, concurrent.futures, multiprocessing, sys
    sys.path.insert(0, {tests!r})
    from support.synthetic import SyntheticSource
    from layerwatch.tui.app import LayerwatchApp

    def pool_round_trip():
        context = multiprocessing.get_context("forkserver")  # what the engine uses beside threads
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
            return pool.submit(abs, -3).result(timeout=120)

    async def main():
        app = LayerwatchApp(SyntheticSource(), title="pools")
        async with app.run_test():
            print("RESULT", await asyncio.to_thread(pool_round_trip))

    if __name__ == "__main__":
        asyncio.run(main())
    """
)


def test_a_process_pool_started_inside_the_running_app_works(tmp_path: Path) -> None:
    """A fresh process, so no resource tracker is running yet (as in ``layerwatch open``)."""
    script = tmp_path / "pools.py"
    script.write_text(SCRIPT.format(tests=str(Path(__file__).resolve().parents[1])))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    assert "RESULT 3" in out.stdout, out.stdout + out.stderr
