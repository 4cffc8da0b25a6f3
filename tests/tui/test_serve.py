"""``layerwatch serve``: the TUI in a browser through textual-serve (issue 15 item 4).

The smoke test starts a real server on a free port, fetches the page, opens the websocket the
page would open and waits for the app's first frame; the guard tests check the token and the
bind rules. The browser test (slow) drives Debian's headless Chromium and keeps a screenshot.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("textual_serve")
aiohttp = pytest.importorskip("aiohttp")

FIXTURES = Path(__file__).parents[1] / "fixtures" / "msit"
OPEN = ["open", str(FIXTURES / "golden"), str(FIXTURES / "target")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(
    *args: str, env: dict[str, str] | None = None
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``layerwatch serve ARGS`` in its own process group; yields the URL it printed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "layerwatch.tui", "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        match = re.search(r"on (http://\S+)", line)
        assert match, (
            f"no URL printed: {line!r} {proc.stderr.read() if proc.poll() is not None else ''}"
        )
        yield match.group(1), proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


async def _first_frame(url: str, needle: str, timeout: float = 60.0) -> str:
    """Fetch the page, open its websocket, collect the app's output until ``needle`` shows."""
    async with aiohttp.ClientSession() as http:
        async with http.get(url) as page:
            assert page.status == 200
            html = await page.text()
        ws_url = re.search(r'data-session-websocket-url="([^"]+)"', html).group(1)
        seen = ""
        deadline = time.monotonic() + timeout
        async with http.ws_connect(f"{ws_url}?width=100&height=30") as ws:
            while needle not in seen:
                left = deadline - time.monotonic()
                assert left > 0, f"{needle!r} not in the app's output:\n{seen[-2000:]}"
                msg = await ws.receive(timeout=left)
                if msg.type == aiohttp.WSMsgType.BINARY:
                    seen += msg.data.decode("utf-8", "replace")
                elif msg.type == aiohttp.WSMsgType.TEXT:
                    seen += msg.data
                else:
                    raise AssertionError(f"websocket closed: {msg.type} after:\n{seen[-2000:]}")
            return seen


async def test_serve_page_websocket_and_first_frame() -> None:
    port = _free_port()
    with serving("--port", str(port), *OPEN) as (url, _):
        assert url == f"http://127.0.0.1:{port}/"
        frame = await _first_frame(url, "layerwatch open")
        assert "\x1b[" in frame  # terminal output of the real app, drawn for the browser


async def test_serve_elsewhere_needs_the_token_in_the_url() -> None:
    """Bound beyond loopback, only ``/<token>/`` answers (0.0.0.0 reached via 127.0.0.1)."""
    port = _free_port()
    with serving("--host", "0.0.0.0", "--port", str(port), *OPEN) as (url, _):
        token = url.rstrip("/").rsplit("/", 1)[1]
        assert len(token) >= 24
        local = url.replace("0.0.0.0", "127.0.0.1")
        async with aiohttp.ClientSession() as http:
            for bad in ("/", "/ws", "/static/js/textual.js", f"/{token[:-1]}x/"):
                async with http.get(f"http://127.0.0.1:{port}{bad}") as resp:
                    assert resp.status == 403, bad
            async with http.get(local) as resp:
                assert resp.status == 200
                assert f"ws://127.0.0.1:{port}/{token}/ws" in await resp.text()
        await _first_frame(local, "layerwatch open")


async def test_serve_refuses_other_origins_and_rebound_hosts() -> None:
    """A page elsewhere may not open our websocket; a DNS name rebound to 127.0.0.1 may not
    pass as this server."""
    port = _free_port()
    with serving("--port", str(port), *OPEN) as (url, _):
        async with aiohttp.ClientSession() as http:
            evil = {"Origin": "http://evil.example"}
            async with http.get(f"{url}ws", headers=evil) as resp:
                assert resp.status == 403
            async with http.get(url, headers={"Host": f"evil.example:{port}"}) as resp:
                assert resp.status == 403
            ours = {"Origin": f"http://127.0.0.1:{port}"}
            async with http.ws_connect(f"{url.replace('http', 'ws')}ws", headers=ours) as ws:
                assert not ws.closed


def test_serve_port_in_use_is_one_line_exit_2() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "layerwatch.tui", "serve", "--port", str(port), *OPEN],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"layerwatch serve: port {port} on 127.0.0.1 is in use: pick another with --port"
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["bogus"], "serve shows one of demo, run, watch, open"),
        (["demo", "--headless"], "drop --headless"),
    ],
)
def test_serve_refuses_what_it_cannot_show(args: list[str], says: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "layerwatch.tui", "serve", "--port", "1", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr


def _chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)


@pytest.mark.slow
@pytest.mark.skipif(_chromium() is None, reason="Debian's chromium is not installed")
async def test_serve_in_headless_chromium_screenshot(tmp_path: Path) -> None:
    """A real browser loads the page, runs textual.js, connects and draws the app; the
    screenshot is taken over the DevTools protocol once the page got the app's first byte."""
    port = _free_port()
    shot = Path(os.environ.get("LAYERWATCH_SCREENSHOTS") or tmp_path) / "serve-chromium.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    with serving("--port", str(port), *OPEN) as (url, _), chromium(tmp_path) as devtools:
        async with aiohttp.ClientSession() as http, CDP(http, devtools) as page:
            await page.call("Emulation.setDeviceMetricsOverride", width=1100, height=640,
                            deviceScaleFactor=1, mobile=False)  # fmt: skip
            await page.call("Page.enable")
            await page.call("Page.navigate", url=url)
            started = "document.body.classList.contains('-first-byte')"
            await page.until(started, timeout=60)
            await asyncio.sleep(2.5)  # the app's first full frame after the connection
            png = await page.call("Page.captureScreenshot", format="png")
    shot.write_bytes(base64.b64decode(png["data"]))
    assert shot.stat().st_size > 20_000  # a drawn terminal, not the blank intro page


@contextlib.contextmanager
def chromium(tmp_path: Path) -> Iterator[str]:
    """Headless Chromium with DevTools on a free port; yields the first page's websocket URL."""
    proc = subprocess.Popen(
        [
            str(_chromium()), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--remote-debugging-port=0", f"--user-data-dir={tmp_path / 'profile'}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        browser = ""
        while not browser and time.monotonic() < deadline and proc.stderr is not None:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
            found = re.search(r"DevTools listening on (ws://\S+)", line)
            browser = found.group(1) if found else ""
        assert browser, "chromium did not open DevTools"
        port = re.search(r":(\d+)/", browser).group(1)
        for _ in range(100):
            with contextlib.suppress(OSError):
                import json
                import urllib.request

                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list") as resp:
                    pages = [t for t in json.load(resp) if t.get("type") == "page"]
                if pages:
                    yield pages[0]["webSocketDebuggerUrl"]
                    return
            time.sleep(0.1)
        raise AssertionError("chromium has no page target")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


class CDP:
    """The few DevTools-protocol calls the browser test needs, over aiohttp's websocket."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http, self.url, self.next_id = http, url, 0

    async def __aenter__(self) -> CDP:
        self.ws = await self.http.ws_connect(self.url, max_msg_size=64 << 20)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.ws.close()

    async def call(self, method: str, **params: object) -> dict:
        self.next_id += 1
        await self.ws.send_json({"id": self.next_id, "method": method, "params": params})
        while True:
            msg = await self.ws.receive_json(timeout=60)
            if msg.get("id") == self.next_id:
                assert "error" not in msg, msg
                return msg["result"]

    async def until(self, expression: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
            if result.get("result", {}).get("value") is True:
                return
            await asyncio.sleep(0.2)
        raise AssertionError(f"{expression} still false after {timeout}s")
