"""The MCP server over streamable HTTP: a bearer token, Host/Origin checks, and an optional idle exit.

Used by `kope serve --transport http` (a server you run and point HTTP clients at) and by the home's daemon
(started on demand by stdio clients, loopback only, always with a random token, exits when idle).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE, TransportSecuritySettings
from starlette.types import ASGIApp, Receive, Scope, Send

from kope_mcp.errors import KopeError
from kope_mcp.settings import KopeSettings

log = logging.getLogger(__name__)

MCP_PATH = "/mcp"


class HttpConfigError(KopeError):
    code = "http_config"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class HttpOptions:
    host: str = "127.0.0.1"
    port: int = 8765
    token: str | None = None
    allowed_hosts: list[str] = field(default_factory=list)
    allowed_origins: list[str] = field(default_factory=list)
    idle_exit_s: float | None = None  # the daemon's: stop after this long without any request or open stream

    def validate(self) -> None:
        if not is_loopback(self.host):
            if not self.token:
                raise HttpConfigError(f"binding to {self.host} (not loopback) requires a token: set KOPE_TOKEN or "
                                      "pass --token-file FILE")
            if not self.allowed_hosts:
                raise HttpConfigError(f"binding to {self.host} (not loopback) requires the Host values clients "
                                      "will use, e.g. --allowed-host kope.example:8765 (DNS-rebinding protection)")

    def security(self) -> TransportSecuritySettings | None:
        # Loopback: the SDK's own defaults (DNS-rebinding protection on for 127.0.0.1/localhost).
        if is_loopback(self.host) and not self.allowed_hosts and not self.allowed_origins:
            return None
        hosts = self.allowed_hosts or [f"{self.host}:*", self.host]
        return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts,
                                         allowed_origins=self.allowed_origins)


class Activity:
    """Requests in flight (an open event stream counts) and when the last one ended."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.last = time.monotonic()

    def idle_for(self) -> float:
        return 0.0 if self.in_flight else time.monotonic() - self.last


class BearerTokenAndActivity:
    """ASGI middleware: refuse any HTTP request without `Authorization: Bearer <token>` (when a token is set)
    with a 401 that says what is missing, and count requests for the idle exit."""

    def __init__(self, app: ASGIApp, token: str | None, activity: Activity) -> None:
        self.app, self.activity = app, activity
        self.expected = f"Bearer {token}".encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.expected is not None:
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                body = json.dumps({"error": "unauthorized", "message": "this kope-mcp server requires "
                                   "'Authorization: Bearer <token>' (the KOPE_TOKEN it was started with)"}).encode()
                await send({"type": "http.response.start", "status": 401, "headers": [
                    (b"content-type", b"application/json"), (b"www-authenticate", b'Bearer realm="kope-mcp"')]})
                await send({"type": "http.response.body", "body": body})
                return
        self.activity.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.activity.in_flight -= 1
            self.activity.last = time.monotonic()


class RequestBodyLimit:
    """ASGI middleware: a request body over the transport's limit is answered with a JSON-RPC error an MCP client
    shows (`source_too_large: ...` with the limits), not the SDK's bare-text 413 that clients report as "Server
    returned an error response". Counts streamed bodies too; nothing over the limit is buffered."""

    def __init__(self, app: ASGIApp, limit: int, max_source_bytes: int) -> None:
        self.app, self.limit, self.max_source_bytes = app, limit, max_source_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            await self._refuse(send, int(declared))
            return
        body, messages = 0, []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            body += len(message.get("body", b""))
            if body > self.limit:
                await self._refuse(send, body, at_least=True)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Any:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send, size: int, at_least: bool = False) -> None:
        text = (f"source_too_large: the request body is {'over ' if at_least else ''}{size:,} bytes; this server "
                f"takes at most {self.limit:,} bytes per request, and a kernel source of at most "
                f"{self.max_source_bytes:,} bytes (KOPE_MAX_SOURCE_BYTES): send one kernel file")
        body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": text}}).encode()
        await send({"type": "http.response.start", "status": 413, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: any free port), bound before the server starts so the port can be published."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise HttpConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


def serve_http(settings: KopeSettings, options: HttpOptions, sock: socket.socket,
               on_ready: Callable[[], None] | None = None) -> None:
    """Serve until interrupted (or idle for options.idle_exit_s). Blocks."""
    import uvicorn

    from kope_mcp.server import build_server

    options.validate()
    server = build_server(settings)
    activity = Activity()
    app: Any = BearerTokenAndActivity(RequestBodyLimit(
        server.streamable_http_app(streamable_http_path=MCP_PATH, transport_security=options.security(),
                                   host=options.host, max_request_body_size=DEFAULT_MAX_REQUEST_BODY_SIZE),
        DEFAULT_MAX_REQUEST_BODY_SIZE, settings.max_source_bytes), options.token, activity)
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
    web = uvicorn.Server(config)

    async def watch_idle() -> None:
        while not web.started:
            await anyio.sleep(0.05)
        if on_ready is not None:
            on_ready()
        if options.idle_exit_s is None:
            return
        while not web.should_exit:
            await anyio.sleep(min(1.0, options.idle_exit_s / 4))
            if activity.idle_for() >= options.idle_exit_s:
                log.info("idle for %.0f s: stopping", options.idle_exit_s)
                web.should_exit = True

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_idle)
            await web.serve(sockets=[sock])
            tg.cancel_scope.cancel()

    anyio.run(main)
