"""What every handler needs: the app state, running a service off the event loop, errors and progress."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio.from_thread
import anyio.to_thread
from mcp.server.mcpserver import Context
from mcp.types import ToolAnnotations

from kope_mcp.errors import MAX_AGENT_CHARS, check_length
from kope_mcp.experience.service import ExperienceService
from kope_mcp.memory.records import AgentInfo
from kope_mcp.services.workbench import Workbench

T = TypeVar("T")


# Annotations of the tools that add to the workbench or the memory: they never delete or overwrite anything.
APPENDS = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False,
                          open_world_hint=False)


@dataclass
class AppState:
    workbench: Workbench
    experience: ExperienceService


class LiveState:
    """The lifespan's AppState for handlers that get no Context (static resources)."""

    def __init__(self) -> None:
        self.state: AppState | None = None

    def get(self) -> AppState:
        if self.state is None:
            raise RuntimeError("the server is not running (its lifespan has not started)")
        return self.state


def agent_info(ctx: Context[AppState], label: str | None = None) -> AgentInfo:
    """The MCP client that is calling, from its clientInfo (initialize handshake or discover), plus the agent
    label the caller chose (which model or role: clients with one name can run several)."""
    params = getattr(ctx.session, "client_params", None)
    info = getattr(params, "client_info", None)
    label = label.strip() if label and label.strip() else None
    check_length("agent", label, MAX_AGENT_CHARS)
    if info is None:
        return AgentInfo(label=label)
    return AgentInfo(name=info.name or "unknown", version=info.version or "", label=label)


AGENT_LABEL_DOC = ("Who is working, beyond the client's name: the model or role, e.g. 'opus-4 planner'. Recorded "
                   "with the session and lessons so other agents can see whose experience they read.")


def app_state(ctx: Context[AppState]) -> AppState:
    return ctx.request_context.lifespan_context


async def call_service(ctx: Context[AppState], fn: Callable[..., T], *args: Any, progress: bool = False,
                       **kwargs: Any) -> T:
    """Run a blocking service call in a worker thread (a KopeError it raises becomes the tool error in one place,
    ``KopeMCPServer.call_tool``)."""

    def report(done: float, total: float, message: str) -> None:
        anyio.from_thread.run(ctx.report_progress, done, total, message)

    if progress:
        kwargs["progress"] = report
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))
