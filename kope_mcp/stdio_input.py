"""The stdio wire's input, with lone UTF-16 surrogates made harmless before the SDK parses a line.

JSON allows the escape "\\ud800" on its own; Python's json accepts it, but the SDK's parser rejects the whole line
and the client is never answered (it waits forever). Each such code point becomes U+FFFD, so the call is answered
like any other (`unknown_task: no task '\\ufffd'`). Like the SDK's own stdio transport, the process's fd 0 is
pointed at the null device while serving, so a child process can never read the wire.
"""

from __future__ import annotations

import json
import os
from typing import Any

import anyio

_SURROGATES = range(0xD800, 0xE000)


def clean_line(line: str) -> str:
    if "\\u" not in line and "\\U" not in line:
        return line  # no escape at all: nothing to clean (the common case costs a substring test)
    try:
        message = json.loads(line)
    except ValueError:
        return line  # not JSON: the SDK reports it as before
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


class CleanStdin:
    """An async line iterator over the wire's stdin for ``stdio_server(stdin=...)``."""

    def __init__(self) -> None:
        wire = os.dup(0)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        self._file = anyio.wrap_file(open(wire, encoding="utf-8", errors="replace", closefd=True))  # noqa: SIM115

    def __aiter__(self) -> CleanStdin:
        return self

    async def __anext__(self) -> str:
        line = await self._file.readline()
        if not line:
            raise StopAsyncIteration
        return clean_line(line)
