"""The MCP server over streamable HTTP: a bearer token, Host/Origin checks, and an optional idle exit.

Used by `kope serve --transport http` (a server you run and point HTTP clients at) and by the home's daemon
(started on demand by stdio clients, loopback only, always with a random token, exits when idle).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import secrets
import socket
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
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
    token_source: str = "the KOPE_TOKEN it was started with"  # named in a 401, so a client knows where to look

    def validate(self) -> None:
        # Loopback included: any user of this machine can reach 127.0.0.1 (user `nobody` got 200 without one).
        if not self.token:
            raise HttpConfigError(f"serving HTTP on {self.host} requires a token: set KOPE_TOKEN, pass --token-file "
                                  "FILE, or let `kope serve` keep one in the home (http-token)")
        if not is_loopback(self.host) and not self.allowed_hosts:
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

    def __init__(self, app: ASGIApp, token: str | None, activity: Activity,
                 token_source: str = "the KOPE_TOKEN it was started with") -> None:
        self.app, self.activity, self.token_source = app, activity, token_source
        self.expected = token.encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.expected is not None:
            scheme, _, given = dict(scope.get("headers") or []).get(b"authorization", b"").partition(b" ")
            # The scheme is case-insensitive (RFC 9110 11.1), the token is not.
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.expected):
                body = json.dumps({"error": "unauthorized", "message": "this kope-mcp server requires "
                                   f"'Authorization: Bearer <token>' ({self.token_source})"}).encode()
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


VIEW_PREFIX = "/view/"
# The pages' own policy (also in their <meta>): their inline script and style, and requests to this server only.
VIEW_CSP = (b"default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
            b"connect-src 'self'; frame-ancestors 'none'")


class ViewPages:
    """ASGI: GET /view/memory and /view/session/<kernel id> answer the views' HTML (views/): code, no data, so
    without the token. The page reads its data over this server's MCP endpoint, with the token `kope view` put in
    the address's fragment; every other request goes on to the bearer check."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        name = ("experience" if path == VIEW_PREFIX + "memory" else
                "session" if path.startswith(VIEW_PREFIX + "session/") and len(path) > len(VIEW_PREFIX) + 8 else None)
        if name is None or scope.get("method") not in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        from kope_mcp.views import page

        body = page(name).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/html; charset=utf-8"), (b"content-security-policy", VIEW_CSP),
            (b"cache-control", b"no-store"), (b"x-content-type-options", b"nosniff"),
            (b"referrer-policy", b"no-referrer")]})
        await send({"type": "http.response.body", "body": body if scope["method"] == "GET" else b""})


# A client has this long to send a request's headers, and then its body; one that trickles them in would otherwise
# hold a connection (and a slot of the server's) for as long as it likes.
HEADER_DEADLINE_S = 5.0
BODY_DEADLINE_S = 30.0


def deadline_protocol() -> type[Any]:
    """uvicorn's h11 protocol, closing a connection whose request headers are not complete within
    HEADER_DEADLINE_S of its first byte (or of the connection), on every request of a kept-alive connection."""
    import asyncio

    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderDeadlineProtocol(H11Protocol):  # type: ignore[misc]
        _header_timer: asyncio.TimerHandle | None = None

        def _between_requests(self) -> bool:
            cycle = getattr(self, "cycle", None)
            return cycle is None or bool(cycle.response_complete)

        def _arm(self) -> None:
            if self._header_timer is None and self._between_requests():
                self._header_timer = self.loop.call_later(HEADER_DEADLINE_S, self._too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _too_slow(self) -> None:
            self._header_timer = None
            if self._between_requests() and not self.transport.is_closing():
                log.info("closed a connection whose request headers took over %.0f s", HEADER_DEADLINE_S)
                self.transport.close()

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            self._arm()
            super().data_received(data)
            if not self._between_requests():
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderDeadlineProtocol


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
        with anyio.move_on_after(BODY_DEADLINE_S) as reading:
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
        if reading.cancelled_caught:
            text = f"request_timeout: the request body took over {BODY_DEADLINE_S:.0f} s to arrive"
            reply = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": text}}).encode()
            await send({"type": "http.response.start", "status": 408, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(reply)).encode()),
                (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": reply})
            return

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


def envelope_problem(message: Any) -> str | None:
    """Why a POSTed JSON value is not one JSON-RPC 2.0 message MCP takes (the -32600 text), or None when it is.
    The SDK answers these with -32602 and a pydantic dump of its message union; JSON-RPC says Invalid Request."""
    if isinstance(message, list):
        return ("invalid_request: JSON-RPC batches are not accepted (MCP dropped batching in 2025-06-18): send "
                "one message per request")
    if not isinstance(message, dict):
        return f"invalid_request: a JSON-RPC message is a JSON object, not {type(message).__name__}"
    if message.get("jsonrpc") != "2.0":
        return 'invalid_request: a JSON-RPC 2.0 message needs "jsonrpc": "2.0"'
    if "method" not in message and "result" not in message and "error" not in message:
        return ("invalid_request: a message needs a method (a request or notification) or a result or error "
                "(a response)")
    ident = message.get("id")
    if "id" in message and (isinstance(ident, bool) or not isinstance(ident, (str, int))):
        return "invalid_request: a message's id is an integer or a string"
    from mcp.types import jsonrpc_message_adapter  # not at import: the stdio proxy imports this module
    from pydantic import ValidationError

    try:
        jsonrpc_message_adapter.validate_python(message)
    except ValidationError:
        return ("invalid_request: not a JSON-RPC 2.0 request, notification or response (a string method, an "
                "integer or string id, object params)")
    return None


class JsonRpcEnvelope:
    """ASGI middleware: a POSTed body that is JSON but not one JSON-RPC message (a batch, no "jsonrpc", no
    method) is answered -32600 Invalid Request in one line, as over stdio. Sits inside RequestBodyLimit, so the
    body it reads is already bounded."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        messages, body = [], b""
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        try:
            parsed = json.loads(body)
        except (ValueError, RecursionError):
            parsed = None  # not JSON: the SDK's own parse error (-32700) says so
        problem = envelope_problem(parsed) if parsed is not None else None
        if problem is not None:
            given = parsed.get("id") if isinstance(parsed, dict) else None
            ident = given if isinstance(given, (str, int)) and not isinstance(given, bool) else None
            reply = json.dumps({"jsonrpc": "2.0", "id": ident,
                                "error": {"code": -32600, "message": problem}}).encode()
            await send({"type": "http.response.start", "status": 400, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(reply)).encode())]})
            await send({"type": "http.response.body", "body": reply})
            return

        async def replay() -> Any:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


TOKEN_FILE = "http-token"


def home_token(home: Path) -> tuple[str, bool]:
    """The home's own bearer token for `kope serve --transport http` without one: (token, newly made). Kept 0600
    in the home, so a restarted server keeps its clients' configuration; refused when anyone else could read it."""
    path = home / TOKEN_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        fd = -1
    if fd >= 0:
        token = secrets.token_urlsafe(32)
        with os.fdopen(fd, "w") as fh:
            fh.write(token + "\n")
        return token, True
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise HttpConfigError(f"cannot read the home's token {path}: {exc.strerror}") from None
    with os.fdopen(fd) as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise HttpConfigError(f"{path} must be a regular file of yours with mode 0600 (it is "
                                  f"{stat.filemode(info.st_mode)}, uid {info.st_uid}): fix it or remove it")
        token = fh.read(4096).strip()
    if not token:
        raise HttpConfigError(f"{path} is empty: remove it and a new token is made")
    return token, False


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


STOP_DEADLINE_S = 20.0


def _stopping_server_class() -> type[Any]:
    import uvicorn

    class StoppingServer(uvicorn.Server):  # type: ignore[misc]
        """Asked to stop (SIGTERM, SIGINT), a server ends every sandbox in flight at once, so the calls they served
        answer `server_stopping:` within the graceful shutdown, and exits within STOP_DEADLINE_S whatever else is
        stuck (the home's lock goes with the process; every acknowledged write is already committed)."""

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if not self.should_exit:
                from kope_mcp.runtime.sandbox import end_all_runs  # not at import: the stdio proxy imports this module

                ended = end_all_runs()
                log.info("stopping (signal %d): ended %d run(s) in flight", sig, ended)
                watchdog = threading.Timer(STOP_DEADLINE_S, _exit_now)
                watchdog.daemon = True
                watchdog.start()
            super().handle_exit(sig, frame)

    return StoppingServer


def _exit_now() -> None:
    log.error("still running %.0f s after being asked to stop: exiting now", STOP_DEADLINE_S)
    logging.shutdown()
    os._exit(1)


def http_app(settings: KopeSettings, options: HttpOptions, activity: Activity) -> Any:
    """The ASGI app `serve_http` serves: the MCP server's streamable HTTP app inside the envelope check, the body
    limit and the bearer token (none when options.token is None: only tools/conformance.py asks for that)."""
    from kope_mcp.app.event_store import RETRY_MS, per_session
    from kope_mcp.app.server import build_server

    server = build_server(settings)
    mcp_app = server.streamable_http_app(streamable_http_path=MCP_PATH, transport_security=options.security(),
                                         host=options.host, max_request_body_size=DEFAULT_MAX_REQUEST_BODY_SIZE,
                                         retry_interval=RETRY_MS)
    per_session(server.session_manager)  # resumable streams: a dropped connection mid-profile gets the rest
    return ViewPages(BearerTokenAndActivity(RequestBodyLimit(JsonRpcEnvelope(mcp_app), DEFAULT_MAX_REQUEST_BODY_SIZE,
                                                             settings.max_source_bytes),
                                            options.token, activity, options.token_source))


def serve_http(settings: KopeSettings, options: HttpOptions, sock: socket.socket,
               on_ready: Callable[[], None] | None = None) -> None:
    """Serve until interrupted (or idle for options.idle_exit_s). Blocks."""
    import uvicorn

    options.validate()
    activity = Activity()
    app = http_app(settings, options, activity)
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5,
                            http=deadline_protocol())
    web = _stopping_server_class()(config)

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
