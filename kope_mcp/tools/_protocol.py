"""The protocol's own refusals, worded like the tools' and with the standard codes.

The SDK checks a tool's arguments leniently (pydantic's lax mode: `deterministic: "yes"` is True, an argument the
tool does not have is dropped without a word), answers a prompt it cannot render with -32603 "Internal server
error", and ignores a pagination cursor it never handed out. A model learns nothing from any of these; here each
is one line that starts with a stable code and says what is valid.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, Prompt
from pydantic import BaseModel, ValidationError

from kope_mcp.tools._errors import describe_validation

# The list methods: this server answers each in one page, so a cursor is never one it handed out.
PAGINATED = ("tools/list", "resources/list", "resources/templates/list", "prompts/list")


def argument_names(model: type[BaseModel]) -> set[str]:
    return {field.alias or name for name, field in model.model_fields.items()}


def check_tool_arguments(tool: str, model: type[BaseModel], arguments: Mapping[str, Any]) -> str | None:
    """Why these arguments are refused (one line, `invalid_argument: ...`), or None when they are valid.

    Strict as JSON Schema reads the tool's input schema: an argument the tool does not have is refused rather
    than dropped, and a value of the wrong JSON type is refused rather than coerced ("yes" is not a boolean, "5"
    is not an integer). The caller passes the arguments as the SDK pre-parses them: a list or object sent as a
    JSON string (some clients do) is read as JSON first."""
    known = argument_names(model)
    unknown = sorted(set(arguments) - known)
    if unknown:
        shown = ", ".join(f"`{name}`" for name in unknown)
        valid = ", ".join(sorted(known)) or "none"
        verb = "is not an argument" if len(unknown) == 1 else "are not arguments"
        return f"invalid_argument: {tool}: {shown} {verb} of this tool; its arguments: {valid}"
    try:
        model.model_validate_json(json.dumps(dict(arguments)), strict=True)
    except ValidationError as exc:
        return describe_validation(tool, exc)
    except (TypeError, ValueError):  # not JSON at all: the SDK's own check reports it
        return None
    return None


def prompt_refusal(prompts: Sequence[Prompt], name: str, arguments: Mapping[str, Any] | None) -> MCPError | None:
    """The -32602 error for a prompts/get this server cannot answer, or None."""
    prompt = next((p for p in prompts if p.name == name), None)
    if prompt is None:
        names = ", ".join(sorted(p.name for p in prompts)) or "none"
        return MCPError(INVALID_PARAMS, f"unknown_prompt: no prompt {name!r}; prompts: {names}")
    given = dict(arguments or {})
    declared = {arg.name: arg.required for arg in prompt.arguments or []}
    unknown = sorted(set(given) - set(declared))
    missing = sorted(arg for arg, required in declared.items() if required and arg not in given)
    not_text = sorted(arg for arg, value in given.items() if not isinstance(value, str))
    problems = ([f"`{arg}` is required" for arg in missing] +
                [f"`{arg}` is not an argument of this prompt" for arg in unknown] +
                [f"`{arg}` must be a string" for arg in not_text if arg in declared])
    if problems:
        valid = ", ".join(f"{arg}{'' if required else ' (optional)'}" for arg, required in declared.items())
        return MCPError(INVALID_PARAMS, f"invalid_argument: {name}: " + "; ".join(problems) +
                        f"; its arguments: {valid}")
    return None


async def refuse_foreign_cursors(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    """Server middleware: a list request with a cursor is -32602, since this server never hands one out (every
    list fits one page), rather than a first page the client would take for the page after its cursor."""
    if ctx.method in PAGINATED and ctx.params is not None and ctx.params.get("cursor") is not None:
        raise MCPError(INVALID_PARAMS, f"invalid_cursor: {ctx.method} answers in one page and never returns a "
                       f"nextCursor, so {str(ctx.params.get('cursor'))[:40]!r} is not a cursor of this server; "
                       "call it without one")
    return await call_next(ctx)
