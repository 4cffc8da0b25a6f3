"""TUI under load: a 4 096 tokens × 1 000 blocks session fed at 20 000 cells/s.

    . .venv/bin/activate && OMP_NUM_THREADS=1 python tests/bench/bench_tui.py [--seconds 12] [--size 200x50]

The app runs headless (``App.run_test``) over a source whose producer thread pushes
``ResultBatch``es of ``CellUpdate``s into the real ``QueueSink`` at the given rate: new tokens
at the bottom plus re-updates of recent rows, as a live session does. The model is first
filled with 4 000 tokens through ``GridModel.apply`` (timed: the bulk rate of ``open``), the
stream adds the last 96 and keeps updating. Measured, medians and p95 over the run:

- frame: one screen update (``Screen._on_timer_update``: layout if needed, render the dirty
  lines, and the escape-sequence encoding a real terminal would get, timed here because the
  headless driver skips it), while updates stream; and one full cold repaint.
- key latency: a key event handed to the driver → the first frame that shows the moved cursor.
- RSS after the run and peak (``VmHWM``).

Baseline in the same run: the same frame and key measurements with nothing streaming.
Goals: ≤ 30 ms per frame, ≤ 50 ms key latency, ≤ 300 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from textual.strip import Strip

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from layerwatch.engine.seam import (
    BlockInfo,
    CellState,
    CellUpdate,
    QueueSink,
    ResultBatch,
    RunStatus,
    Summary,
)
from layerwatch.tui.app import LayerwatchApp
from layerwatch.tui.grid import LayerGrid
from textual import events

TOKENS, BLOCKS, PREFILLED = 4096, 1000, 4000


def rss_mb() -> tuple[float, float]:
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def blocks() -> tuple[BlockInfo, ...]:
    inner = [
        BlockInfo(i + 1, f"L{i}", "layer", f"root.model.layers.{i}") for i in range(BLOCKS - 3)
    ]
    return (
        BlockInfo(0, "embed", "pre", "root.model.embed_tokens"),
        *inner,
        BlockInfo(BLOCKS - 2, "norm", "post", "root.model.norm"),
        BlockInfo(BLOCKS - 1, "lm_head", "post", "root.lm_head"),
    )


class EmptyView:
    def blocks(self):
        return ()

    def pairs_in_block(self, token, block):
        return []

    def inputs_of(self, result):
        return []

    def explain(self, result):
        raise RuntimeError("no details in the benchmark")


class StreamSource:
    """A ComparisonSource whose producer thread emits ``rate`` cells per second."""

    def __init__(self, rate: float) -> None:
        self.sink = QueueSink()
        self.view = EmptyView()
        self.rate = rate
        self.streaming = threading.Event()
        self.cells_sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.sink.on_batch(
            ResultBatch(blocks=blocks(), runs={"golden": RunStatus("golden", "running", 1)})
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def export(self, path: str) -> str:
        return path

    def _run(self) -> None:
        rng = random.Random(0)
        period = 0.05
        next_token, block = PREFILLED, 0
        nan4 = (float("nan"),) * 4
        while not self._stop.is_set():
            if not self.streaming.is_set():
                time.sleep(0.01)
                continue
            t0 = time.perf_counter()
            n = int(self.rate * period)
            cells = []
            for _ in range(n // 2):  # the live edge: new cells of the newest tokens
                if next_token < TOKENS:
                    cos = 1 - 10 ** -rng.uniform(2, 6)
                    cells.append(
                        CellUpdate(
                            next_token, block, CellState.PASS, (cos, 1e-3, 1e-2, 1e-3), 20, 0
                        )
                    )
                    block += 1
                    if block == BLOCKS:
                        block, next_token = 0, next_token + 1
                else:
                    cells.append(
                        CellUpdate(
                            rng.randrange(TOKENS),
                            rng.randrange(BLOCKS),
                            CellState.WAITING,
                            nan4,
                            0,
                            0,
                        )
                    )
            for _ in range(n - len(cells)):  # re-updates of recent rows (the other side landing)
                token = max(0, min(next_token, TOKENS) - 1 - rng.randrange(64))
                state = CellState.FAIL if rng.random() < 0.01 else CellState.PASS
                cos = 1 - 10 ** -rng.uniform(1, 6)
                cells.append(
                    CellUpdate(
                        token,
                        rng.randrange(BLOCKS),
                        state,
                        (cos, 1e-3, 1e-2, 1e-3),
                        20,
                        int(state == CellState.FAIL),
                    )
                )
            self.sink.on_batch(ResultBatch(cells=cells, summary=Summary(pairs=self.cells_sent)))
            self.cells_sent += len(cells)
            time.sleep(max(0.0, period - (time.perf_counter() - t0)))


def prefill(app: LayerwatchApp) -> float:
    """4 000 tokens through GridModel.apply, 16 tokens per call; returns cells per second."""
    model = app.model
    model.set_blocks(blocks())
    rng = np.random.default_rng(0)
    nan = float("nan")
    spent = 0.0
    for start in range(0, PREFILLED, 16):
        errs = 10 ** -rng.uniform(1, 6, size=16 * BLOCKS)
        cells = [
            CellUpdate(
                start + i // BLOCKS,
                i % BLOCKS,
                CellState.PASS if e < 1e-3 else CellState.FAIL,
                (1 - e, nan, nan, nan),
                20,
                0,
            )
            for i, e in enumerate(errs.tolist())
        ]
        t0 = time.perf_counter()
        model.apply(cells)
        spent += time.perf_counter() - t0
    return PREFILLED * BLOCKS / spent


class Probe:
    """Times every screen update and the encoding a real terminal would receive."""

    def __init__(self, app: LayerwatchApp) -> None:
        self.app = app
        self.frames: list[float] = []
        self.cpu: list[float] = []
        """UI-thread CPU per frame (``thread_time``): the work itself, without waiting for the
        GIL held by the producer thread or for other processes on a shared machine."""
        self.bytes: list[int] = []
        self.last_frame_end = 0.0
        self.shown: dict[tuple[int, int], float] = {}
        """Cursor cell (row, column) → end of the last frame that painted the cursor there."""
        self._painted: list[tuple[int, int]] = []
        self.console = Console(color_system="truecolor", force_terminal=True, file=io.StringIO())
        screen = app.screen
        original = screen._on_timer_update
        display = app._display
        grid = screen.query_one(LayerGrid)
        render_line = grid.render_line

        def painting_line(y: int) -> Strip:
            strip = render_line(y)
            top = grid._frame.top if grid._frame is not None else int(grid.scroll_offset.y)
            if y > 0 and top + y - 1 == grid.cursor_row:
                self._painted.append((grid.cursor_row, grid.cursor_col))
            return strip

        def timed_update() -> None:
            t0, c0 = time.perf_counter(), time.thread_time()
            original()
            t1 = time.perf_counter()
            self.frames.append(t1 - t0)
            self.cpu.append(time.thread_time() - c0)
            self.last_frame_end = t1
            for cell in self._painted:
                self.shown[cell] = t1
            self._painted.clear()

        grid.render_line = painting_line  # type: ignore[method-assign]

        def encoding_display(screen, renderable) -> None:
            display(screen, renderable)
            if renderable is not None and hasattr(renderable, "render_segments"):
                self.bytes.append(len(renderable.render_segments(self.console).encode()))

        screen._on_timer_update = timed_update
        screen._update_timer._callback = timed_update
        app._display = encoding_display


async def key_to_frame(
    app: LayerwatchApp, probe: Probe, key: str, timeout: float = 2.0
) -> float | None:
    """Seconds from handing ``key`` to the driver to the end of the first frame that painted
    the cursor on its new cell (``Probe.shown``); ``None`` when it did not move the cursor,
    ``timeout`` when it moved it but no frame showed it in time.

    Waiting instead for the first frame to end after this loop *noticed* the move (as before)
    missed the frame whenever it ran before the loop woke up, and counted the next one: a
    frame later than the key's own, ~10-20 ms more in the median once loaded."""
    grid = app.screen.query_one(LayerGrid)
    before = (grid.cursor_row, grid.cursor_col)
    event = events.Key(key, key if len(key) == 1 else None)
    event.set_sender(app)
    t0 = time.perf_counter()
    app._driver.send_message(event)
    while True:
        await asyncio.sleep(0.0005)
        now = time.perf_counter()
        cell = (grid.cursor_row, grid.cursor_col)
        if cell != before and probe.shown.get(cell, 0.0) >= t0:
            return probe.shown[cell] - t0
        if now - t0 > timeout:
            return timeout if cell != before else None


async def key_latencies(
    app: LayerwatchApp, probe: Probe, presses: int, near_tail: bool
) -> list[float]:
    """Send keys one at a time; each one's latency is key event → the first frame that shows
    the moved cursor (:func:`key_to_frame`); keys that did not move it are left out.

    ``near_tail``: keep the cursor among the newest rows, whose cells the stream keeps
    updating, so each frame also repaints changed rows (the worst case for a key)."""
    grid = app.screen.query_one(LayerGrid)
    grid.set_following(False)
    grid.move_cursor(app.model.n_tokens - 25 if near_tail else 2000, 10)
    await asyncio.sleep(0.1)
    latencies = []
    rng = random.Random(1)
    keys = ["j", "k", "l", "h"] if near_tail else ["j", "k", "l", "h", "pagedown", "pageup"]
    for i in range(presses):
        key = keys[i % 2] if i % 3 == 0 else rng.choice(keys)
        latency = await key_to_frame(app, probe, key)
        if latency is not None:
            latencies.append(latency)
        await asyncio.sleep(rng.uniform(0.05, 0.15))
    return latencies


async def loading_key_latencies(
    app: LayerwatchApp, probe: Probe, until: threading.Event, timeout: float = 2.0
) -> tuple[list[float], int]:
    """Keys while a session loads, until ``until`` is set: j, l, k, h from a middle row, so
    every key moves the cursor while tokens keep arriving below it (``key_latencies`` parks
    the cursor on the last row, where ``j`` and page-down do not move and their samples were
    lost). A key with no frame within ``timeout`` counts as ``timeout`` seconds, not as
    nothing. Returns the latencies and how many keys timed out."""
    grid = app.screen.query_one(LayerGrid)
    grid.set_following(False)
    while app.model.n_tokens < 3 and not until.is_set():
        await asyncio.sleep(0.05)
    grid.move_cursor(app.model.n_tokens // 2, 10)
    await asyncio.sleep(0.1)
    latencies: list[float] = []
    lost = 0
    rng = random.Random(1)
    i = 0
    while not until.is_set():
        latency = await key_to_frame(app, probe, ("j", "l", "k", "h")[i % 4], timeout)
        i += 1
        latencies.append(timeout if latency is None else latency)
        lost += latency is None or latency >= timeout
        await asyncio.sleep(rng.uniform(0.05, 0.15))
    return latencies, lost


def cold_repaint(app: LayerwatchApp, cpu: list[float] | None = None) -> float:
    """Seconds of one full repaint of the screen with the grid's line cache emptied: the
    worst frame a user can see (a resize, a jump far away). ``cpu`` gets the UI thread's CPU
    seconds of it (``thread_time``): on a shared box the steadier figure.

    Following the newest token leaves up to a third of the page blank below it (the grid's
    ``_last_top``), lines that cost next to nothing: the view is first moved, untimed, to a
    page of tokens on every line, and the grid must have drawn them all."""
    screen = app.screen
    grid = screen.query_one(LayerGrid)
    rows = min(grid.model.n_tokens, grid.data_height)
    if int(grid.scroll_offset.y) + rows > grid.model.n_tokens:
        grid.move_cursor(grid.model.n_tokens - rows, grid.cursor_col)
        screen._on_timer_update()  # the scroll it asked for, outside the timing
    grid._cache.clear()
    screen.refresh()
    grid.refresh()
    t0, c0 = time.perf_counter(), time.thread_time()
    screen._repaint_required = True
    screen._on_timer_update()
    if cpu is not None:
        cpu.append(time.thread_time() - c0)
    elapsed = time.perf_counter() - t0
    if len(grid._cache) < rows + 1:  # the header and every token line
        raise RuntimeError(f"cold_repaint drew {len(grid._cache)} grid lines, not {rows + 1}")
    return elapsed


def summary_ms(values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    if not ms:
        return "n/a"
    p95 = ms[min(len(ms) - 1, int(0.95 * len(ms)))]
    return (
        f"median {statistics.median(ms):6.2f} ms · p95 {p95:6.2f} · max {ms[-1]:6.2f} (n={len(ms)})"
    )


async def main(seconds: float, size: tuple[int, int], rate: float) -> None:
    source = StreamSource(rate)
    app = LayerwatchApp(source, title="bench", color_system="truecolor")
    rate_bulk = prefill(app)
    rss_filled = rss_mb()[0]
    async with app.run_test(size=size) as pilot:
        await pilot.pause(0.3)
        probe = Probe(app)
        grid = app.screen.query_one(LayerGrid)
        cold_cpu: list[float] = []
        colds = [cold_repaint(app, cold_cpu) for _ in range(20)]
        probe.frames.clear()
        # baseline: nothing streaming
        idle_keys = await key_latencies(app, probe, 30, near_tail=False)
        idle_frames = list(probe.frames)
        # streaming, following the newest token: every visible row changes every tick
        grid.set_following(True)
        probe.frames.clear()
        probe.cpu.clear()
        probe.bytes.clear()
        source.streaming.set()
        t_start, sent0 = time.perf_counter(), source.cells_sent
        await asyncio.sleep(seconds / 2)
        follow_frames, follow_cpu, follow_bytes = (
            list(probe.frames),
            list(probe.cpu),
            list(probe.bytes),
        )
        # streaming, keys pressed among the rows being updated
        probe.frames.clear()
        probe.cpu.clear()
        stream_keys = []
        while time.perf_counter() - t_start < seconds:
            stream_keys += await key_latencies(app, probe, 10, near_tail=True)
        key_frames, key_cpu = list(probe.frames), list(probe.cpu)
        elapsed = time.perf_counter() - t_start
        fed = (source.cells_sent - sent0) / elapsed
        applied = app.model.n_tokens
        source.streaming.clear()
        await pilot.pause(0.2)
        rss, peak = rss_mb()
        await pilot.press("q")

    print(
        f"layerwatch TUI bench · {TOKENS}×{BLOCKS} cells · terminal {size[0]}×{size[1]} · Python {sys.version.split()[0]}"
        f" · load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(
        f"bulk apply (GridModel.apply, 16k cells/call): {rate_bulk / 1e6:.2f} M cells/s; RSS after fill {rss_filled:.0f} MB"
    )
    print(f"stream fed {fed:,.0f} cells/s for {elapsed:.1f} s; rows now {applied}")
    print(f"cold full repaint        {summary_ms(colds)}   goal ≤ 16 ms")
    print(f"  UI-thread CPU          {summary_ms(cold_cpu)}")
    print(f"frame, idle (baseline)   {summary_ms(idle_frames)}")
    print(f"frame, stream+follow     {summary_ms(follow_frames)}   goal ≤ 30 ms")
    print(f"  UI-thread CPU/frame    {summary_ms(follow_cpu)}")
    print(f"frame, stream+keys       {summary_ms(key_frames)}   goal ≤ 30 ms")
    print(f"  UI-thread CPU/frame    {summary_ms(key_cpu)}")
    if follow_bytes:
        print(
            f"bytes/frame (follow)     median {statistics.median(follow_bytes) / 1024:.1f} KB · max {max(follow_bytes) / 1024:.1f} KB (truecolor)"
        )
    print(f"key→frame, idle          {summary_ms(idle_keys)}")
    print(f"key→frame, streaming     {summary_ms(stream_keys)}   goal ≤ 50 ms")
    if idle_frames and key_frames and idle_keys and stream_keys:
        print(
            f"ratios streaming/idle: frame {statistics.median(key_frames) / statistics.median(idle_frames):.2f}× · "
            f"key {statistics.median(stream_keys) / statistics.median(idle_keys):.2f}×"
        )
    print(f"RSS {rss:.0f} MB · peak {peak:.0f} MB   goal ≤ 300 MB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--size", default="200x50")
    parser.add_argument("--rate", type=float, default=20_000)
    args = parser.parse_args()
    w, h = (int(x) for x in args.size.split("x"))
    asyncio.run(main(args.seconds, (w, h), args.rate))
