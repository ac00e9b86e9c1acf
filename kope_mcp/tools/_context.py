"""What every handler needs: the app state, running a service off the event loop, errors and progress."""

from __future__ import annotations

import math
import threading
import time
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
# A call that reports progress says something at least this often, even while one step (a queue wait, a
# measurement) lasts long: clients time a silent call out, and people think it hung.
HEARTBEAT_S = 2.0


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
    progress_state = _Progress(ctx, token)

    if progress:
        kwargs["progress"] = progress_state.from_thread

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
        async with anyio.create_task_group() as tasks:
            if progress:
                tasks.start_soon(progress_state.send)
            try:
                await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
            except anyio.get_cancelled_exc_class():
                token.cancel()
                raise
            finally:
                progress_state.finish()
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            # Bounded: a call wedged past its runs' ends must not hold the handler (and the server's stop) forever.
            await anyio.to_thread.run_sync(done.wait, CANCEL_WAIT_S)
        raise
    ok, value = outcome[0]
    if ok:
        return cast(T, value)
    raise value


class _Progress:
    """A call's progress notifications: the service's steps, and between them, when a step runs long, the same
    step again every HEARTBEAT_S with its elapsed time. One task sends them all, in order, so the progress value
    rises with every notification (the protocol requires it): a heartbeat adds a shrinking fraction of a step,
    staying below the next. That task lives in the handler's scope: once the call is cancelled it sends nothing."""

    def __init__(self, ctx: Context[AppState], token: cancel.CallToken) -> None:
        self.ctx, self.token = ctx, token
        self.steps, self.inbox = anyio.create_memory_object_stream[tuple[float, float, str]](math.inf)

    def from_thread(self, done: float, total: float, message: str) -> None:
        if self.token.cancelled:  # nothing more is sent once cancelled: the call stops here too
            raise CancelledCallError("the call")
        try:
            anyio.from_thread.run_sync(self.steps.send_nowait, (done, total, message))
        except anyio.ClosedResourceError:  # the handler has gone (cancelled) between the check and the send
            raise CancelledCallError("the call") from None

    def finish(self) -> None:
        self.steps.close()  # the sender sends what is queued, then ends

    async def send(self) -> None:
        value, step, since, beats = 0.0, (0.0, 0.0, ""), time.monotonic(), 0
        async with self.inbox:
            while True:
                with anyio.move_on_after(HEARTBEAT_S) as quiet:
                    try:
                        step = await self.inbox.receive()
                    except anyio.EndOfStream:
                        return
                if not quiet.cancelled_caught:
                    since, beats, value = time.monotonic(), 0, max(value, step[0])
                    await self.ctx.report_progress(value, step[1], step[2])
                    continue
                done, total, message = step
                if not message or done >= total:  # nothing said yet, or the last step: nothing to creep towards
                    continue
                beats += 1
                value = max(value, done + 0.9 * min(1.0, total - done) * (1 - 0.5 ** beats))
                await self.ctx.report_progress(value, total, f"{message} ({time.monotonic() - since:.0f} s)")
