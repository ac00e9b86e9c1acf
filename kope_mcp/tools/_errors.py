"""What a model reads when a tool call is refused: the stable code first, then one sentence it can act on.

The SDK prefixes every tool error with `Error executing tool <name>:` and reports argument validation as pydantic's
multi-line text with a documentation URL. A model does better with `unknown_task: no task 'x'; valid task ids: ...`
and `invalid_argument: token_budget must be at least 1 (got 0)`.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from kope_mcp.errors import KopeError

_MAX_SHOWN = 80


def model_facing_message(tool: str, exc: BaseException) -> str | None:
    """The text for a refused call, or None to leave the SDK's own."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, KopeError):
            return str(seen)
        if isinstance(seen, ValidationError):
            return describe_validation(tool, seen)
        seen = seen.__cause__
    return None


def describe_validation(tool: str, error: ValidationError) -> str:
    parts = [_one(item) for item in error.errors(include_url=False)[:5]]
    more = len(error.errors()) - len(parts)
    return (f"invalid_argument: {tool}: " + "; ".join(parts) + (f"; and {more} more" if more > 0 else "") +
            ". The tool's input schema lists every argument and its type.")


def _one(item: Any) -> str:
    loc = [str(p) for p in item.get("loc", ()) if p not in ("model", tool_args_model_name(item))]
    name = ".".join(loc) or "(arguments)"
    kind, msg = item.get("type", ""), str(item.get("msg", "invalid"))
    if kind == "missing":
        return f"`{name}` is required"
    if kind == "extra_forbidden":
        return f"`{name}` is not an argument of this tool"
    given = item.get("input")
    shown = repr(given)
    if len(shown) > _MAX_SHOWN:
        shown = shown[:_MAX_SHOWN] + "..."
    return f"`{name}`: {msg[0].lower() + msg[1:] if msg else msg} (got {shown})"


def tool_args_model_name(item: Any) -> str:
    # The SDK validates against a generated `<tool>Arguments` model whose name may head the location.
    loc = item.get("loc", ())
    return str(loc[0]) if loc and str(loc[0]).endswith("Arguments") else ""
