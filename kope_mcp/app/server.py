"""build_server(): the MCP server with its tools; the workbench is created once per process in the lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError, UnexpectedToolError

import kope_mcp
from kope_mcp.app.instructions import INSTRUCTIONS
from kope_mcp.errors import KopeError, ServerStoppingError
from kope_mcp.settings import KopeSettings
from kope_mcp.tools import memory as memory_tools
from kope_mcp.tools import prompts as prompt_tools
from kope_mcp.tools import tasks as task_tools
from kope_mcp.tools import views as view_tools
from kope_mcp.tools import workbench as workbench_tools
from kope_mcp.tools._context import AppState, LiveState
from kope_mcp.tools._errors import model_facing_message
from kope_mcp.tools._protocol import check_tool_arguments, prompt_refusal, refuse_foreign_cursors


class KopeMCPServer(MCPServer[AppState]):
    """The SDK's server, with refusals worded for the model: the stable code first, arguments named."""

    async def call_tool(self, name: str, arguments: dict[str, Any],
                        context: Context[AppState, Any] | None = None) -> Any:
        tool = self._tool_manager.get_tool(name)
        if tool is not None:
            # Strict, before the SDK's lenient check: a wrong type or an unknown argument is refused, not coerced
            # or dropped (tools/_protocol.py); on the arguments as the SDK reads them (a list sent as JSON text).
            refusal = check_tool_arguments(name, tool.fn_metadata.arg_model,
                                           tool.fn_metadata.pre_parse_json(arguments))
            if refusal is not None:
                raise ToolError(refusal)
        try:
            return await super().call_tool(name, arguments, context)
        except UnexpectedToolError as exc:
            # The one place a KopeError (a call the model can fix) becomes the tool error: the SDK wraps anything a
            # handler raises but ToolError as a crash; its own text is the message the model reads.
            if isinstance(exc.__cause__, KopeError):
                raise ToolError(str(exc.__cause__)) from exc.__cause__
            from kope_mcp.runtime.sandbox import stopping

            if stopping():  # a run the stopping server ended mid-way (a reference pool, say): not a crash
                raise ToolError(str(ServerStoppingError(name))) from exc
            raise  # a crash: the SDK keeps its text off the wire and logs the traceback
        except ToolError as exc:
            message = model_facing_message(name, exc)
            if message is None and not any(tool.name == name for tool in await self.list_tools()):
                names = ", ".join(sorted(tool.name for tool in await self.list_tools()))
                message = f"unknown_tool: no tool {name!r}; tools: {names}"
            if message is None:
                raise
            raise ToolError(message) from exc

    async def get_prompt(self, name: str, arguments: dict[str, Any] | None = None,
                         context: Context[AppState, Any] | None = None) -> Any:
        # The SDK answers an unknown prompt or a missing argument with -32603 "Internal server error".
        refusal = prompt_refusal(await self.list_prompts(), name, arguments)
        if refusal is not None:
            raise refusal
        return await super().get_prompt(name, arguments, context)

    async def read_resource(self, uri: Any, context: Context[AppState, Any] | None = None) -> Any:
        try:
            return await super().read_resource(uri, context)
        except ResourceNotFoundError as exc:
            if str(exc).startswith("Unknown resource"):  # the SDK's lookup, not a template's own refusal
                known = [str(r.uri) for r in await self.list_resources()]
                known += [t.uri_template for t in await self.list_resource_templates()]
                raise ResourceNotFoundError(f"unknown_resource: no resource {str(uri)[:200]!r}; resources: "
                                            f"{', '.join(sorted(known))}") from exc
            raise

    async def run_stdio_async(self) -> None:
        from mcp.server.stdio import stdio_server
        from mcp.types import jsonrpc_message_adapter

        from kope_mcp.app.stdio_input import stdio_wire

        # MCPServer.run_stdio_async with our own stdin reader (stdio_input: malformed lines answered, not fatal):
        # the SDK has no public way to hand it streams, so this runs its low-level server the way it does.
        wire = stdio_wire(jsonrpc_message_adapter)
        async with stdio_server(*wire) as (read_stream, write_stream):  # type: ignore[arg-type]
            await self._lowlevel_server.run(read_stream, write_stream,
                                            self._lowlevel_server.create_initialization_options())


# Arrays of at least this many bytes get memory of their own from the kernel, given back when freed. glibc's
# default raises its threshold to the largest array freed (up to 32 MiB), after which a profile's many
# tens-of-MiB arrays come from its heaps and stay in the process: 8 clients profiling for 5 minutes held a
# median 2.9 GB (peak 3.8), against 0.84 GB (peak 1.7) with the threshold fixed (tools/load_test.py --profilers 8).
MMAP_THRESHOLD_BYTES = 1 << 20
_M_MMAP_THRESHOLD = -3


def bound_allocator() -> bool:
    """Fix glibc's mmap threshold for this process (a server's); False where there is no glibc mallopt."""
    import ctypes

    try:
        return bool(ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False


def build_server(settings: KopeSettings | None = None) -> MCPServer[AppState]:
    settings = settings or KopeSettings.from_env()
    bound_allocator()
    from kope_mcp.experience.config import load_selection

    selection = load_selection(settings.selection)  # a wrong KOPE_SELECTION stops here, before serving
    live = LiveState()

    @asynccontextmanager
    async def lifespan(_: MCPServer[AppState]) -> AsyncIterator[AppState]:
        from kope_mcp.experience.service import ExperienceService
        from kope_mcp.services.remeasure import RemeasureConfig, Remeasurer
        from kope_mcp.services.workbench import Workbench

        settings.home.mkdir(parents=True, exist_ok=True)
        workbench = Workbench(settings)
        workbench.memory.start()
        # Noisy results measured again while nobody is waiting and the machine is quiet (services/remeasure.py).
        remeasurer = Remeasurer(workbench, RemeasureConfig(every_s=settings.remeasure_every_s))
        remeasurer.start()
        try:
            live.state = AppState(workbench=workbench, experience=ExperienceService(
                workbench.memory, workbench.tasks, workbench.target_hardware_key, selection))
            yield live.state
        finally:
            live.state = None
            remeasurer.stop(timeout_s=10.0)
            workbench.memory.stop()
            workbench.memory.close()
            if workbench.cluster is not None:
                workbench.cluster.close()  # its Ray driver child leaves the cluster with it

    server: MCPServer[Any] = KopeMCPServer(
        name="kope-mcp",
        version=kope_mcp.__version__,
        instructions=INSTRUCTIONS,
        lifespan=lifespan,
        log_level="WARNING",
        middleware=[refuse_foreign_cursors],
        extensions=[view_tools.apps()],
    )
    task_tools.register(server)
    workbench_tools.register(server)
    memory_tools.register(server, live)
    prompt_tools.register(server, live)
    view_tools.register(server, live)
    return server
