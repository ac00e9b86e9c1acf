"""`kope serve` over stdio, when the home is shared: an MCP server that forwards every request to the home's
owner over loopback HTTP, so any number of stdio clients (and HTTP clients) use one database at once.

One MCP session to the owner is opened on the first request, with the stdio client's own clientInfo (so the
owner records who did what), and kept: a call through the proxy is one request on it (list_tasks 11-15 ms here)
instead of a session of its own (initialize, event stream, close: 73 ms). A session that breaks is dropped and
the next request finds or starts the owner again, which makes a crashed or stopped daemon invisible. A request
that could not reach the owner is retried once; a call that was cut off mid-way is reported as an error, never
retried (it may have run).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx2
import mcp.types as types
from mcp import Client
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE
from mcp.shared.exceptions import MCPError

import kope_mcp
from kope_mcp.app import daemon
from kope_mcp.app import proxy_catalogue as catalogue
from kope_mcp.app.http_server import MCP_PATH
from kope_mcp.app.instructions import INSTRUCTIONS
from kope_mcp.app.proxy_early import EarlyAnswers, shipped_tools, tools_key
from kope_mcp.app.stdio_input import stdio_wire
from kope_mcp.errors import MAX_TEXT_CHARS, KopeError, SourceTooLargeError, TooLongError
from kope_mcp.settings import KopeSettings, check_home

log = logging.getLogger(__name__)


_CONNECT: tuple[type[BaseException], ...] = (httpx2.ConnectError, ConnectionRefusedError)
_BROKEN: tuple[type[BaseException], ...] = (httpx2.HTTPError, anyio.BrokenResourceError, anyio.EndOfStream,
                                            anyio.ClosedResourceError, OSError)
_CAUGHT: tuple[type[BaseException], ...] = (BaseExceptionGroup, MCPError, *_CONNECT, *_BROKEN)


_ENVELOPE_BYTES = 64 * 1024  # the JSON-RPC envelope and headers around the arguments


class _CutOff(Exception):
    """The connection to the owner broke after the request was sent: the call may or may not have run."""


def _cut_off(exc: BaseException) -> bool:
    return isinstance(exc, _BROKEN) or (isinstance(exc, MCPError) and exc.code == types.CONNECTION_CLOSED)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


class _Request:
    def __init__(self, ctx: Any, call: Any) -> None:
        self.ctx, self.call = ctx, call
        self.done = anyio.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        # The forwarded call's scope: cancelling it makes the SDK's client send the owner `notifications/cancelled`.
        self.scope = anyio.CancelScope()

    def abandon(self) -> None:
        """The stdio client cancelled (or left): the owner is told to stop the call."""
        self.scope.cancel()


class OwnerLink:
    """The proxy's one session to the home's owner, owned by a task of its own (a client's context must be entered
    and left in one task); requests from any handler are served concurrently inside it."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self._send, self._inbox = anyio.create_memory_object_stream[_Request](64)
        # Requests sent on the current session and not yet answered (those the session's end must answer). Answered
        # ones are dropped as it grows: each holds its call's arguments and result, for a session of any length.
        self.in_flight: list[_Request] = []

    async def request(self, ctx: Any, call: Any) -> Any:
        request = _Request(ctx, call)
        try:
            await self._send.send(request)
            await request.done.wait()
        except anyio.get_cancelled_exc_class():
            request.abandon()
            raise
        if request.error is not None:
            raise request.error
        return request.result

    async def run(self) -> None:
        """Serve requests until cancelled: open a session for the first one, keep it while it works."""
        while True:
            first = await self._inbox.receive()
            try:
                state = await anyio.to_thread.run_sync(daemon.ensure, self.home)
            except daemon.DaemonError as exc:
                self._answer(first, error=exc)
                continue
            self.in_flight = [first]
            from mcp.client.streamable_http import streamable_http_client

            try:
                transport = streamable_http_client(state.url.rstrip("/") + MCP_PATH,
                                                   http_client=daemon.http_client(state))
                async with Client(transport, client_info=_caller(first.ctx), mode="legacy") as client, \
                        anyio.create_task_group() as tg:
                    tg.start_soon(self._serve, client, first)
                    prune_at = 64
                    while True:
                        request = await self._inbox.receive()
                        self.in_flight.append(request)
                        if len(self.in_flight) >= prune_at:
                            self.in_flight = [r for r in self.in_flight if not r.done.is_set()]
                            prune_at = 2 * len(self.in_flight) + 64  # amortised: many live calls stay linear
                        tg.start_soon(self._serve, client, request)
            except (Exception, BaseExceptionGroup) as exc:  # the session broke (however it did): drop it, keep serving
                if isinstance(exc, BaseExceptionGroup) and not exc.split(Exception)[0]:
                    raise  # nothing but cancellation inside: the proxy is ending
                for request in self.in_flight:
                    if not request.done.is_set():
                        self._answer(request, error=exc)
                self.in_flight = []
                log.debug("session with the owner ended: %r", exc)

    async def _serve(self, client: Client, request: _Request) -> None:
        try:
            with request.scope:
                self._answer(request, result=await request.call(client))
            if request.scope.cancelled_caught:
                self._answer(request, error=_CutOff("cancelled by its client"))
        except _CAUGHT as exc:
            self._answer(request, error=exc)
            if any(isinstance(e, (*_CONNECT, *_BROKEN)) or _cut_off(e) for e in _leaves(exc)):
                raise  # the connection is gone: end the session, the next request opens another

    @staticmethod
    def _answer(request: _Request, *, result: Any = None, error: BaseException | None = None) -> None:
        request.result, request.error = result, error
        request.done.set()


class HomeProxy:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.link = OwnerLink(home)
        self._tools: types.ListToolsResult | None = None
        self._settings_checked = False
        self._settings_warning: str | None = None
        self._kept: set[tuple[str, str]] = set()  # catalogue answers this proxy has kept (proxy_catalogue.py)
        self.early = EarlyAnswers(home)
        self.background: anyio.abc.TaskGroup | None = None  # the proxy's own tasks (run_stdio_proxy sets it)

    async def _ask(self, ctx: Any, call: Any) -> Any:
        """_with_owner for a request that is not a tool call: a KopeError (no daemon, an unusable home) becomes a
        protocol error with its one line, not an internal error."""
        try:
            return await self._with_owner(ctx, call)
        except KopeError as exc:
            raise MCPError(SERVER_ERROR, str(exc)) from None

    async def _with_owner(self, ctx: Any, call: Any) -> Any:
        check_home(self.home)  # a few system calls; one line naming the home, not [Errno 20] from deep inside
        for attempt in (1, 2):
            state = daemon.read_state(self.home)
            try:
                return await self.link.request(ctx, call)
            except daemon.DaemonError:
                raise
            except _CAUGHT as exc:  # task groups wrap transport errors
                leaves = _leaves(exc)
                if all(isinstance(e, _CONNECT) for e in leaves):
                    where = state.url if state is not None else "its address"
                    if attempt == 2:
                        raise daemon.DaemonError(f"cannot reach the kope daemon for {self.home} at {where}: "
                                                 f"{leaves[0]}") from None
                    log.warning("daemon at %s unreachable; finding or starting it again", where)
                    continue  # nothing was sent: safe to retry against a fresh daemon
                if any(_cut_off(e) for e in leaves):
                    raise _CutOff(str(next(e for e in leaves if _cut_off(e)))[:120]) from None
                if len(leaves) == 1 and isinstance(leaves[0], MCPError):
                    raise leaves[0] from None  # the owner's own protocol error, unwrapped
                raise
        raise AssertionError("unreachable")

    async def list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        if _cursor(params) is not None:  # the daemon's to judge (it hands out none: refused there)
            return await self._ask(ctx, lambda c: c.list_tools(cursor=_cursor(params)))
        if self._tools is None:
            self._tools = shipped_tools() or _cached_tools(self.home)
            if self._tools is not None:
                await self._prepare(ctx)
        if self._tools is None:
            self._tools = await self._ask(ctx, lambda c: c.list_tools())
            _cache_tools(self.home, self._tools)
        return self._tools

    async def _prepare(self, ctx: Any) -> None:
        """The tool list was answered here: get ready for the first call meanwhile (a model takes seconds to make
        it), without delaying this answer. With a daemon accepting, the session to it is opened (a ping: 0.2-0.3 s
        of imports and handshake off the first call); with none yet, this proxy's own answers are built."""
        if self.background is None:
            return
        if await anyio.to_thread.run_sync(self._owner_ready):
            self.background.start_soon(self._ping, ctx)
        else:
            threading.Thread(target=self.early.warm, name="kope-early-warm", daemon=True).start()

    async def _ping(self, ctx: Any) -> None:
        with contextlib.suppress(Exception):  # only a head start: the first call reports what went wrong
            await self._with_owner(ctx, lambda c: c.list_prompts())

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        oversized = _oversized(params.arguments or {})
        if oversized is not None:
            return _error(oversized)
        meta = ctx.meta if isinstance(ctx.meta, dict) else {}
        token = meta.get("progress_token", meta.get("progressToken"))

        async def forward_progress(progress: float, total: float | None, message: str | None) -> None:
            if token is not None:
                with contextlib.suppress(Exception):  # a client that left must not fail the call
                    await ctx.session.send_progress_notification(token, progress, total, message)

        arguments = params.arguments or {}
        if not await anyio.to_thread.run_sync(self._owner_ready):
            early = await anyio.to_thread.run_sync(self._early, params.name, arguments)
            if early is not None:
                start_owner(self.home)  # the next call that needs the daemon finds it started
                return early
        try:
            result: types.CallToolResult = await self._with_owner(ctx, lambda c: c.call_tool(
                params.name, arguments, progress_callback=forward_progress))
            asked = (params.name, json.dumps(arguments, sort_keys=True))
            if params.name in catalogue.CATALOGUE_TOOLS and asked not in self._kept:
                self._kept.add(asked)  # once per answer and proxy: the key's folder walk costs ~4 ms
                await anyio.to_thread.run_sync(catalogue.keep, self.home, params.name, arguments,
                                               result.model_copy(deep=True))
            return self._with_settings_warning(result)
        except KopeError as exc:  # the daemon cannot be had (DaemonError), or the home cannot be used
            return _error(str(exc))
        except MCPError as exc:
            return _error(f"the kope daemon refused {params.name}: {exc.message}")
        except _CutOff as exc:
            return _error(f"daemon_unavailable: the kope daemon for {self.home} stopped during {params.name} "
                          f"({exc}); it may or may not have completed. Call again: a new daemon starts, with "
                          "every acknowledged result intact.")

    def _early(self, tool: str, arguments: dict[str, Any]) -> types.CallToolResult | None:
        """While no daemon accepts: the catalogue as the daemon last gave it in the same circumstances
        (proxy_catalogue.py), else what this proxy can answer as the daemon would (proxy_early.py)."""
        try:
            check_home(self.home)
        except KopeError:
            return None  # the call goes on to say what is wrong with the home, as every call there does
        return catalogue.cached(self.home, tool, arguments) or self.early.answer(tool, arguments)

    def _owner_ready(self) -> bool:
        state = daemon.running(self.home)
        return state is not None and bool(state.url) and daemon.accepting(state.url)

    def _with_settings_warning(self, result: types.CallToolResult) -> types.CallToolResult:
        """Every answer whose structured form has `warnings` says when this client's KOPE_* settings are not the
        ones its home's daemon uses (the first answer also in its text, for clients that read only that)."""
        first = not self._settings_checked
        if first:
            self._settings_checked = True
            self._settings_warning = self._settings_mismatch()
            if self._settings_warning:
                log.warning("%s", self._settings_warning)
        warning = self._settings_warning
        if not warning:
            return result
        if isinstance(result.structured_content, dict) and isinstance(result.structured_content.get("warnings"),
                                                                      list):
            result.structured_content["warnings"].append(warning)
        if first:
            result.content.append(types.TextContent(type="text", text=f"warning: {warning}"))
        return result

    def _settings_mismatch(self) -> str | None:
        state = daemon.read_state(self.home)
        if state is None or not state.settings:
            return None
        mine = KopeSettings.from_env().client_visible()
        differ = [f"{k}={mine[k] or '(unset)'} (the daemon uses {state.settings[k] or '(unset)'})" for k in sorted(mine)
                  if k in state.settings and mine[k] != state.settings[k]]
        if not differ:
            return None
        return (f"this client's settings {', '.join(differ)} are not in effect: the daemon that serves "
                f"{self.home} (pid {state.pid}) uses its own. Run `kope serve --no-daemon` for private settings, "
                "or `kope daemon stop` so the next call starts a daemon with this client's")

    async def list_prompts(self, ctx: Any, params: Any) -> types.ListPromptsResult:
        return await self._ask(ctx, lambda c: c.list_prompts(cursor=_cursor(params)))

    async def get_prompt(self, ctx: Any, params: types.GetPromptRequestParams) -> types.GetPromptResult:
        return await self._ask(ctx, lambda c: c.get_prompt(params.name, params.arguments or {}))

    async def list_resource_templates(self, ctx: Any, params: Any) -> types.ListResourceTemplatesResult:
        return await self._ask(ctx, lambda c: c.list_resource_templates(cursor=_cursor(params)))

    async def list_resources(self, ctx: Any, params: Any) -> types.ListResourcesResult:
        return await self._ask(ctx, lambda c: c.list_resources(cursor=_cursor(params)))

    async def read_resource(self, ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        return await self._ask(ctx, lambda c: c.read_resource(params.uri))


# JSON-RPC's range for a server's own errors: the request was fine, this server cannot serve it now.
SERVER_ERROR = -32000


def _cursor(params: Any) -> str | None:
    cursor = getattr(params, "cursor", None)
    return cursor if isinstance(cursor, str) else None


def _caller(ctx: Any) -> types.Implementation | None:
    """The stdio client's clientInfo: per request (2026-07-28 protocol) or from its initialize handshake."""
    meta = ctx.meta if isinstance(ctx.meta, dict) else {}
    info = meta.get("io.modelcontextprotocol/clientInfo")
    if isinstance(info, dict) and info.get("name"):
        return types.Implementation(name=str(info["name"]), version=str(info.get("version", "")))
    info = getattr(getattr(ctx.session, "client_params", None), "client_info", None)
    return types.Implementation(name=info.name, version=info.version) if info else None


def _tools_cache(home: Path) -> Path:
    return home / daemon.DAEMON_DIR / f"tools-{tools_key()}.json"


def _cached_tools(home: Path) -> types.ListToolsResult | None:
    """The tool list as the daemon of this same code gave it before: a cold client lists tools without waiting
    for a daemon to start."""
    try:
        return types.ListToolsResult.model_validate_json(_tools_cache(home).read_text())
    except (OSError, ValueError):
        return None


def _cache_tools(home: Path, tools: types.ListToolsResult) -> None:
    path = _tools_cache(home)
    with contextlib.suppress(OSError):
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(tools.model_dump_json(by_alias=True, exclude_none=True))
        os.replace(tmp, path)


def _oversized(arguments: dict[str, Any]) -> str | None:
    """The refusal for a call the daemon's HTTP body limit would cut off with a bare 413, worded as the daemon
    words an over-cap argument; None when the call fits."""
    sizes = {name: len(json.dumps(value).encode()) for name, value in arguments.items()}
    if sum(sizes.values()) <= DEFAULT_MAX_REQUEST_BODY_SIZE - _ENVELOPE_BYTES:
        return None
    name = max(sizes, key=lambda k: sizes[k])
    if name == "source":
        source = arguments["source"]
        size = len(source.encode("utf-8", errors="replace")) if isinstance(source, str) else sizes[name]
        return str(SourceTooLargeError(size, KopeSettings.from_env().max_source_bytes))
    value = arguments[name]
    return str(TooLongError(name, len(value) if isinstance(value, str) else sizes[name], MAX_TEXT_CHARS))


def _error(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)


def start_owner(home: Path) -> None:
    """Find or start the home's owner in the background (at most one starts, however many ask)."""

    def start() -> None:
        with contextlib.suppress(KopeError):  # the first request that needs it reports it, with the log
            check_home(home)
            daemon.ensure(home)

    threading.Thread(target=start, name="kope-start-owner", daemon=True).start()


def run_stdio_proxy(home: Path) -> None:
    """Serve stdio, forwarding to the home's owner. One is started now if none runs, in the background: the
    handshake is answered here at once, and the first request waits for the owner only if it is not ready yet."""

    try:
        check_home(home)
    except KopeError as exc:  # served anyway: every call answers this line, which the client shows
        log.error("%s", exc)
    proxy = HomeProxy(home)  # first: it reads whether the home has a memory before a daemon starts making one
    start_owner(home)
    server: Server[Any] = Server(
        "kope-mcp", version=kope_mcp.__version__, instructions=INSTRUCTIONS,
        on_list_tools=proxy.list_tools, on_call_tool=proxy.call_tool,
        on_list_resources=proxy.list_resources, on_read_resource=proxy.read_resource,
        on_list_resource_templates=proxy.list_resource_templates,
        on_list_prompts=proxy.list_prompts, on_get_prompt=proxy.get_prompt,
    )

    def client_left() -> None:
        unanswered = sum(not r.done.is_set() for r in proxy.link.in_flight)
        if unanswered:  # one line for a client that died mid-call, not a traceback
            log.info("the client went away with %d call(s) in flight; the daemon is told to stop them", unanswered)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            proxy.background = tg
            tg.start_soon(proxy.link.run)
            wire = stdio_wire(types.jsonrpc_message_adapter, on_end=client_left)
            async with stdio_server(*wire) as (read, write):  # type: ignore[arg-type]
                await server.run(read, write, server.create_initialization_options())
            tg.cancel_scope.cancel()

    anyio.run(main)
