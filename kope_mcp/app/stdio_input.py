"""The stdio wire, made safe for what clients really send before the SDK parses a line.

- JSON allows the escape "\\ud800" on its own; Python's json accepts it, but the SDK's parser rejects the whole line
  and the client is never answered (it waits forever). Each such code point becomes U+FFFD, so the call is answered
  like any other (`unknown_task: no task '\\ufffd'`).
- A line that is not JSON, or not a JSON-RPC message, is answered here with the JSON-RPC error the specification
  names (-32700 parse error, -32600 invalid request, with the request's id when it has one), instead of the SDK's
  silence, and the server keeps serving.

Like the SDK's own stdio transport, fd 0 is pointed at the null device and fd 1 at stderr while serving, so a child
process can neither read nor write the wire.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import anyio
from pydantic import TypeAdapter, ValidationError

_SURROGATES = range(0xD800, 0xE000)
PARSE_ERROR = -32700
INVALID_REQUEST = -32600


def clean_line(line: str) -> str:
    if "\\u" not in line and "\\U" not in line:
        return line  # no escape at all: nothing to clean (the common case costs a substring test)
    try:
        message = json.loads(line)
    except ValueError:
        return line  # not JSON: answered as a parse error later
    cleaned = _replace(message)
    return line if cleaned == message else json.dumps(cleaned, ensure_ascii=False) + "\n"


def _replace(value: Any) -> Any:
    if isinstance(value, str):
        return "".join("\ufffd" if ord(c) in _SURROGATES else c for c in value) if any(
            ord(c) in _SURROGATES for c in value) else value
    if isinstance(value, list):
        return [_replace(v) for v in value]
    if isinstance(value, dict):
        return {_replace(k): _replace(v) for k, v in value.items()}
    return value


def malformed_answer(line: str, messages: TypeAdapter[Any]) -> str | None:
    """The JSON-RPC error answering a line the SDK cannot take (one JSON line), or None when the line is fine.
    ``messages`` is the SDK's own JSON-RPC message adapter (the transport layer passes it in, so this module
    does not depend on MCP). A notification-shaped mistake is still answered: the sender cannot be told any
    other way."""
    try:
        messages.validate_json(line, by_name=False)
        return None
    except ValidationError as exc:
        try:
            message = json.loads(line)
        except ValueError as json_exc:
            return _error_line(None, PARSE_ERROR, f"Parse error: the line is not JSON ({json_exc}); send one "
                                                  "JSON-RPC 2.0 message per line")
        request_id = message.get("id") if isinstance(message, dict) else None
        if not isinstance(request_id, str | int) or isinstance(request_id, bool):
            request_id = None
        first = exc.errors()[0] if exc.errors() else {"msg": "not a JSON-RPC 2.0 message"}
        where = ".".join(str(p) for p in tuple(first.get("loc", ()))[1:])  # [0] names the SDK's union member
        return _error_line(request_id, INVALID_REQUEST,
                           f"Invalid Request: {first['msg']}{f' at {where}' if where else ''}; a JSON-RPC 2.0 "
                           "message has \"jsonrpc\": \"2.0\" and either a \"method\" or a \"result\"/\"error\"")


def _error_line(request_id: str | int | None, code: int, message: str) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}) + "\n"


class WireStdout:
    """The wire's stdout for ``stdio_server(stdout=...)``: every write is one whole line under one lock, so the
    SDK's answers and this module's error answers never interleave."""

    def __init__(self) -> None:
        wire = os.dup(1)
        os.dup2(2, 1)  # stray prints of handlers and children go to stderr, never onto the wire
        self._file = anyio.wrap_file(open(wire, "w", encoding="utf-8", closefd=True))  # noqa: SIM115
        self._lock = anyio.Lock()

    async def write(self, text: str) -> int:
        async with self._lock:
            written = await self._file.write(text)
            await self._file.flush()
            return written

    async def flush(self) -> None:
        async with self._lock:
            await self._file.flush()


class CleanStdin:
    """An async line iterator over the wire's stdin for ``stdio_server(stdin=...)``; malformed lines are answered
    on ``stdout`` and not passed on."""

    def __init__(self, stdout: WireStdout, messages: TypeAdapter[Any],
                 on_end: Callable[[], None] | None = None) -> None:
        self._on_end = on_end
        wire = os.dup(0)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        self._file = anyio.wrap_file(open(wire, encoding="utf-8", errors="replace", closefd=True))  # noqa: SIM115
        self._stdout = stdout
        self._messages = messages

    def __aiter__(self) -> CleanStdin:
        return self

    async def __anext__(self) -> str:
        while True:
            line = await self._file.readline()
            if not line:
                if self._on_end is not None:
                    self._on_end()
                    self._on_end = None
                raise StopAsyncIteration
            if not line.strip():
                continue  # a blank line is no message and needs no answer
            line = clean_line(line)
            answer = malformed_answer(line, self._messages)
            if answer is None:
                return line
            await self._stdout.write(answer)


def stdio_wire(messages: TypeAdapter[Any], on_end: Callable[[], None] | None = None) -> tuple[CleanStdin, WireStdout]:
    """The (stdin, stdout) pair to pass to the SDK's ``stdio_server``; ``messages`` is the SDK's
    ``jsonrpc_message_adapter``; ``on_end`` is called once when the client closes stdin (before the SDK hears of
    it: the calls in flight are still running)."""
    stdout = WireStdout()
    return CleanStdin(stdout, messages, on_end), stdout
