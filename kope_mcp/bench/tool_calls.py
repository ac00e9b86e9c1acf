"""A tool call as every bench client makes it: the structured answer, or ToolFailed with the tool's one line."""

from __future__ import annotations

from typing import Any

from mcp import Client


class ToolFailed(RuntimeError):
    pass


async def call_tool(client: Client, name: str, **args: Any) -> dict[str, Any]:
    result = await client.call_tool(name, args)
    if result.is_error or result.structured_content is None:
        raise ToolFailed(f"{name}: {getattr(result.content[0], 'text', '?') if result.content else '?'}")
    return result.structured_content
