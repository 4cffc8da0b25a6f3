"""``layerwatch serve [demo|run|watch|open ARGS]``: the same TUI in a browser (textual-serve).

Each browser connection starts ``python -m layerwatch.tui COMMAND ARGS`` with Textual's web
driver (textual-serve's ``AppService``); the app sees a browser instead of a terminal
(``frontends.interactive``) and draws the same screens.

Safety, because the page drives a process that can launch commands:

* bound to 127.0.0.1 unless ``--host`` says otherwise;
* bound anywhere else, every URL (page, websocket, static files, downloads) sits under a
  random secret path segment (``http://HOST:PORT/<token>/``), checked in constant time by a
  middleware; textual-serve itself has no authentication;
* the app is started as an argument vector (``create_subprocess_exec``), never through a
  shell (textual-serve's own ``AppService`` uses ``create_subprocess_shell``);
* requests from another origin (a page elsewhere opening our websocket) are refused, and on
  loopback so is any Host that is not a loopback name (DNS rebinding);
* the port is bound before anything else: a port in use is one line and exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import ipaddress
import os
import secrets
import socket
import sys
from typing import Any

from layerwatch.capture.errors import LayerwatchError

SERVABLE = ("demo", "run", "watch", "open")
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
DEFAULT_PORT = 8000


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_served_args(argv: list[str]) -> list[str]:
    """The served command's own arguments, checked once here (a typo fails now, not in every
    browser tab): one line and exit 2 through argparse."""
    from layerwatch.tui.cli import build_parser

    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv or argv[0] not in SERVABLE:
        raise LayerwatchError(
            f"serve shows one of {', '.join(SERVABLE)} in the browser: "
            f"e.g. `layerwatch serve demo` (got {' '.join(argv) or 'nothing'})"
        )
    if "--headless" in argv:
        raise LayerwatchError("serve shows the TUI: drop --headless")
    build_parser().parse_args(argv)  # exits 2 with argparse's one line on a bad option
    return argv


def bind(host: str, port: int) -> socket.socket:
    """Bind now, so a port in use is a clear line before any server machinery starts."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(64)
    except OSError as exc:
        sock.close()
        why = "is in use" if exc.errno in (98, 48, 10048) else f"cannot be bound ({exc.strerror})"
        raise LayerwatchError(f"port {port} on {host} {why}: pick another with --port") from None
    sock.set_inheritable(False)
    return sock


def make_server(argv: list[str], host: str, port: int, token: str | None) -> Any:
    """A textual-serve ``Server`` that runs ``argv`` without a shell, under ``/<token>/``."""
    try:
        import aiohttp_jinja2
        from aiohttp import web
        from textual_serve.app_service import AppService
        from textual_serve.server import Server
    except ImportError:
        raise LayerwatchError(
            "serve needs the optional extra: pip install 'layerwatch[serve]' (textual-serve)"
        ) from None

    command = [sys.executable, "-m", "layerwatch.tui", *argv]

    class ExecAppService(AppService):  # type: ignore[misc]
        async def _open_app_process(self, width: int = 80, height: int = 24) -> Any:
            env = self._build_environment(width=width, height=height)
            self._process = process = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
            )
            self._stdin = process.stdin
            return process

    prefix = f"/{token}" if token else ""
    loopback = is_loopback(host)

    class LayerwatchServer(Server):  # type: ignore[misc]
        async def _make_app(self) -> web.Application:
            middlewares = [self.same_origin, *([self.guard] if token else [])]
            app = web.Application(middlewares=middlewares)
            aiohttp_jinja2.setup(
                app, loader=__import__("jinja2").FileSystemLoader(self.templates_path)
            )
            app.add_routes(
                [
                    web.get(f"{prefix}/", self.handle_index, name="index"),
                    web.get(f"{prefix}/ws", self.handle_websocket, name="websocket"),
                    web.get(f"{prefix}/download/{{key}}", self.handle_download, name="download"),
                    web.static(f"{prefix}/static", self.statics_path, name="static"),
                ]
            )
            app.on_startup.append(self.on_startup)
            return app

        @web.middleware
        async def same_origin(self, request: web.Request, handler: Any) -> web.StreamResponse:
            # A web page in the same browser may open a websocket to any address (no
            # same-origin rule for websockets): only our own page may (its Origin is our
            # Host). Bound to loopback, the Host must be a loopback name too, so a DNS name
            # rebound to 127.0.0.1 cannot pass as "same origin".
            origin = request.headers.get("Origin")
            if origin is not None and origin.split("://", 1)[-1] != request.host:
                raise web.HTTPForbidden(text="layerwatch serve: cross-origin request refused\n")
            if loopback and request.host.rsplit(":", 1)[0].strip("[]") not in LOOPBACK_NAMES:
                raise web.HTTPForbidden(text="layerwatch serve: unknown Host refused\n")
            return await handler(request)

        @web.middleware
        async def guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
            first = request.path.lstrip("/").split("/", 1)[0]
            if not hmac.compare_digest(first.encode(), str(token).encode()):
                raise web.HTTPForbidden(text="layerwatch serve: this URL needs the token\n")
            return await handler(request)

        async def on_startup(self, app: web.Application) -> None:
            pass  # the command prints its own line (no logo on stdout)

        @aiohttp_jinja2.template("app_index.html")
        async def handle_index(self, request: web.Request) -> dict[str, Any]:
            # URLs from the request's own host: bound to 0.0.0.0, the browser knows the name.
            base = f"{request.scheme}://{request.host}"
            router = request.app.router
            ws = f"{'wss' if request.scheme == 'https' else 'ws'}://{request.host}"
            return {
                "font_size": 16,
                "app_websocket_url": ws + str(router["websocket"].url_for()),
                "config": {
                    "static": {
                        "url": base + str(router["static"].url_for(filename="/")).rstrip("/") + "/"
                    }
                },
                "application": {"name": self.title},
            }

        async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
            # textual-serve's handler with our AppService (argument vector, no shell).
            websocket = web.WebSocketResponse(heartbeat=15)
            width = _int(request.query.get("width", "80"), 80)
            height = _int(request.query.get("height", "24"), 24)
            service: Any = None
            try:
                await websocket.prepare(request)
                service = ExecAppService(
                    " ".join(command),
                    write_bytes=websocket.send_bytes,
                    write_str=websocket.send_str,
                    close=websocket.close,
                    download_manager=self.download_manager,
                    debug=self.debug,
                )
                await service.start(width, height)
                await self._process_messages(websocket, service)
            except asyncio.CancelledError:
                await websocket.close()
            finally:
                if service is not None:
                    with contextlib.suppress(Exception):
                        await service.stop()
            return websocket

    display = host if ":" not in host else f"[{host}]"
    server = LayerwatchServer(
        " ".join(command), host=host, port=port, title=f"layerwatch {' '.join(argv)}"
    )
    server.url = f"http://{display}:{port}{prefix}/"
    return server


def _int(text: str, default: int) -> int:
    try:
        return int(text)
    except ValueError:
        return default


def run_server(server: Any, sock: socket.socket) -> None:
    """Serve until Ctrl-C / SIGTERM (aiohttp's own signal handling)."""
    from aiohttp import web

    web.run_app(server._make_app(), sock=sock, print=None, handle_signals=True)


def serve_main(args: argparse.Namespace) -> int:
    argv = check_served_args(list(args.served))
    host = args.host
    token = None if is_loopback(host) else (os.environ.get("LAYERWATCH_SERVE_TOKEN") or "")
    if token is not None and not token:
        token = secrets.token_urlsafe(24)
    sock = bind(host, args.port)
    try:
        server = make_server(argv, host, sock.getsockname()[1], token)
    except BaseException:
        sock.close()
        raise
    where = server.url
    if token:
        where += "  (the token in this URL is the only key: share it like a password)"
    print(f"layerwatch serve: {' '.join(argv)} on {where}", flush=True)
    try:
        run_server(server, sock)
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    return 0
