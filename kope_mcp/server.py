"""build_server(): the MCP server with its tools; the workbench is created once per process in the lifespan."""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from mcp.server import MCPServer

import kope_mcp
from kope_mcp.settings import KopeSettings
from kope_mcp.tools import memory as memory_tools
from kope_mcp.tools import tasks as task_tools
from kope_mcp.tools import workbench as workbench_tools
from kope_mcp.tools._context import AppState, LiveState

INSTRUCTIONS = """\
kope-mcp is a kernel-optimisation workbench. The loop: list_tasks -> get_task(task_id) -> write a C kernel ->
compile_kernel(task_id, source) -> run_tests(kernel_id) -> profile_kernel(kernel_id) -> improve and repeat,
passing session_id (and parent_id for the kernel you started from). Correctness comes first: only a kernel that
passed run_tests is profiled. Compile errors and wrong answers are normal results, not failures of the tool.
Every outcome is recorded in a shared experience graph: call query_experience(query, session_id=...) before each
new attempt to get the fixes, wins and pitfalls most relevant to where you are, and record_experience to add
the lesson of a step.
"""


def build_server(settings: KopeSettings | None = None) -> MCPServer[AppState]:
    settings = settings or KopeSettings.from_env()
    live = LiveState()

    @asynccontextmanager
    async def lifespan(_: MCPServer[AppState]) -> AsyncIterator[AppState]:
        from kope_mcp.services.experience import ExperienceService
        from kope_mcp.services.workbench import Workbench

        settings.home.mkdir(parents=True, exist_ok=True)
        workbench = Workbench(settings)
        workbench.memory.start()
        try:
            live.state = AppState(workbench=workbench, experience=ExperienceService(workbench.memory, workbench.tasks))
            yield live.state
        finally:
            live.state = None
            workbench.memory.stop()
            workbench.store.close()

    server: MCPServer[Any] = MCPServer(
        name="kope-mcp",
        version=kope_mcp.__version__,
        instructions=INSTRUCTIONS,
        lifespan=lifespan,
        log_level="WARNING",
    )
    task_tools.register(server)
    workbench_tools.register(server)
    memory_tools.register(server, live)
    return server


def configure_logging(level: str = "INFO") -> None:
    # stdout belongs to the MCP protocol in stdio mode: every log line goes to stderr.
    logging.basicConfig(stream=sys.stderr, level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
