"""What every handler needs: the app state, running a service off the event loop, errors and progress."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio.from_thread
import anyio.to_thread
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError

from kope_mcp.errors import KopeError
from kope_mcp.services.workbench import Workbench

T = TypeVar("T")


@dataclass
class AppState:
    workbench: Workbench


def app_state(ctx: Context[Any, Any]) -> AppState:
    state = ctx.request_context.lifespan_context
    assert isinstance(state, AppState)
    return state


async def call_service(ctx: Context[Any, Any], fn: Callable[..., T], *args: Any, progress: bool = False,
                       **kwargs: Any) -> T:
    """Run a blocking service call in a worker thread; a KopeError becomes a ToolError the model can read."""

    def report(done: float, total: float, message: str) -> None:
        anyio.from_thread.run(ctx.report_progress, done, total, message)

    if progress:
        kwargs["progress"] = report
    try:
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))
    except KopeError as exc:
        raise ToolError(str(exc)) from exc
