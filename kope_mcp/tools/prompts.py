"""optimise_kernel, the prompt that starts the KOPE loop from a client's prompt menu, and one resource per task."""

from __future__ import annotations

from typing import Any

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS

from kope_mcp.errors import KopeError
from kope_mcp.services.catalogue import describe_task
from kope_mcp.tools._context import LiveState


def loop_prompt(task_id: str, backend: str, attempts: int) -> str:
    """The paper's experience-driven loop, as the instructions a model follows with these tools."""
    return f"""Optimise the kernel of task `{task_id}` with the kope tools, backend `{backend}`, in at most \
{attempts} attempts. Follow this loop; the experience memory is shared with other agents, so both what you read \
and what you record matter.

1. Call get_task(task_id="{task_id}") and read the signature for backend `{backend}` (the C prototype, or under \
`targets` the {backend} signature), the naive baseline you must beat, the test cases, the profiling size and the \
rules.
2. Call query_experience(query="what worked for {task_id}", task_id="{task_id}", backend="{backend}") and read \
its `context`: measured wins on this family and hardware, fixes for errors, pitfalls to avoid.
3. Plan one change at a time. Say which strategy you apply, why the evidence suggests it, and the gain you expect.
4. compile_kernel(task_id="{task_id}", backend="{backend}", source=..., strategy="<the strategy in a few words>", \
session_id=<from the first compile>, parent_id=<the kernel you started from>). On a compile error, call \
query_experience(query="<the first error line>", session_id=...) for fixes, then fix and compile again.
5. run_tests(kernel_id=...). If it fails, read the first bad index and the message, query_experience with the \
failure, fix and recompile. Never profile a kernel that did not pass.
6. profile_kernel(kernel_id=...) when the server can time this backend (otherwise the answer says `no_device:`; \
keep optimising for correctness and the static resource report). With a cluster, list_devices shows every \
worker's devices: pass device=<id> to compile_kernel to work there (tests and profiles follow the build). Keep a \
kernel only when its speedup's 95% CI lies above your best so far; a `suspect` result is not a win.
7. After every attempt, failures included, call record_experience(strategy=..., lesson=<what you learned, one \
paragraph>, kernel_id=..., session_id=..., rationale=<why it worked or not>).
8. Go back to 2 (with session_id) until the attempts are used up or two strategies in a row gain nothing. End \
with the best kernel_id, its speedup vs the naive baseline with its CI, and the strategies that mattered."""


def register(server: MCPServer[Any], live: LiveState) -> None:
    @server.prompt(name="optimise_kernel", title="Optimise a kernel with the experience-driven loop")
    def optimise_kernel(task_id: str, backend: str = "c", attempts: str = "8") -> str:
        """Start the KOPE loop on one task: read the task and the shared experience, then plan, compile, test,
        profile and record the why of every attempt. `backend` is c, triton or cuda; `attempts` the budget."""
        workbench = live.get().workbench
        if not (attempts.strip().isdigit() and 0 < int(attempts) <= 100):
            raise MCPError(INVALID_PARAMS, f"invalid_argument: optimise_kernel: `attempts` must be a whole number "
                           f"from 1 to 100 (got {attempts[:40]!r})")
        try:
            task = workbench.tasks.get(task_id)
            workbench.target(backend, task)
        except KopeError as exc:
            # A protocol error with the model-facing text; anything else reaches the client as "Internal error".
            raise MCPError(INVALID_PARAMS, str(exc)) from exc
        return loop_prompt(task.id, backend, int(attempts))

    @server.resource("kope://tasks/{task_id}", name="task", title="One kernel task", mime_type="application/json")
    def task_resource(task_id: str) -> str:
        """Everything get_task returns for one task, as JSON: signatures per backend, reference, baselines,
        cases, profiling size, tolerance and rules."""
        try:
            return describe_task(live.get().workbench, task_id).model_dump_json(indent=1)
        except KopeError as exc:
            raise ResourceNotFoundError(str(exc)) from exc
