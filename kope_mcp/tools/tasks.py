"""list_tasks and get_task: the catalogue and everything needed to write one kernel."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.types import ToolAnnotations
from pydantic import Field

from kope_mcp.models import TaskDetail, TaskList
from kope_mcp.services.catalogue import describe_task, list_tasks
from kope_mcp.tools._context import AppState, app_state, call_service

_READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)


def register(server: MCPServer[Any]) -> None:
    @server.tool(name="list_tasks", title="List kernel tasks", annotations=_READ_ONLY)
    async def list_tasks_tool(
        ctx: Context[AppState],
        family: Annotated[str | None, Field(description="Only this family, e.g. 'matmul', 'reduction'.")] = None,
        level: Annotated[int | None, Field(ge=1, le=4, description="Only this difficulty level (1-4).")] = None,
    ) -> TaskList:
        """List the kernel optimisation tasks: one line each, '<id> (<family>, L<level>): <summary>', with
        '[backends: c, triton, ...]' where a task can be written for more than C; `backends` says what this server
        can do with each (compile, run_tests, profile) and what is missing.

        Next: call get_task(task_id) for the prototype, reference and rules of the one you will work on.
        """
        return await call_service(ctx, list_tasks, app_state(ctx).workbench, family=family, level=level)

    @server.tool(name="get_task", title="Get one task", annotations=_READ_ONLY)
    async def get_task_tool(
        ctx: Context[AppState],
        task_id: Annotated[str, Field(description="A task id from list_tasks, e.g. 'matmul'.")],
    ) -> TaskDetail:
        """Everything needed to write the kernel: what it computes, the exact C prototype, the numpy reference,
        the naive C baseline you must beat, the test cases and profiling size, the tolerance and the rules; and
        under `targets`, for each other backend of the task (triton, cuda), the signature in that language, its
        naive baseline and rules.

        Next: write the source and call compile_kernel(task_id, source, backend=...).
        """
        return await call_service(ctx, describe_task, app_state(ctx).workbench, task_id=task_id)
