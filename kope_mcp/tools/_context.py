"""What every handler needs: the app state, running a service off the event loop, errors and progress."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import anyio.from_thread
import anyio.to_thread
from mcp.server.mcpserver import Context
from mcp.types import ToolAnnotations

from kope_mcp.errors import MAX_AGENT_CHARS, CancelledCallError, check_length
from kope_mcp.experience.service import ExperienceService
from kope_mcp.memory.records import AgentInfo
from kope_mcp.runtime import cancel
from kope_mcp.services.workbench import Workbench

T = TypeVar("T")

# How long a cancelled call's handler waits for its worker thread to notice (its sandboxes are killed at once).
CANCEL_WAIT_S = 10.0


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
    ``KopeMCPServer.call_tool``).

    A cancelled handler (the client's ``notifications/cancelled``, or its session ending) cannot interrupt the
    thread; it cancels the call's token instead, which ends the call's sandboxes and waits at once, stops its
    progress, and keeps it from recording anything (runtime/cancel.py). The handler then waits for the thread,
    which is quick once its runs are ended, so the slot it held is free when the cancel completes."""
    token = cancel.CallToken()

    def report(done: float, total: float, message: str) -> None:
        if token.cancelled:  # nothing more is sent once cancelled: the call stops here too
            raise CancelledCallError("the call")
        anyio.from_thread.run(ctx.report_progress, done, total, message)

    if progress:
        kwargs["progress"] = report

    done = threading.Event()
    outcome: list[Any] = []

    def work() -> None:
        try:
            with cancel.bound(token):
                outcome.append((True, fn(*args, **kwargs)))
        except BaseException as exc:  # handed to the handler as it was raised
            outcome.append((False, exc))
        finally:
            done.set()

    try:
        await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        token.cancel()
        with anyio.CancelScope(shield=True):
            # Bounded: a call wedged past its runs' ends must not hold the handler (and the server's stop) forever.
            await anyio.to_thread.run_sync(done.wait, CANCEL_WAIT_S)
        raise
    ok, value = outcome[0]
    if ok:
        return cast(T, value)
    raise value
