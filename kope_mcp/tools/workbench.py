"""compile_kernel, run_tests and profile_kernel: the compile -> test -> measure loop."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.types import ToolAnnotations
from pydantic import Field

from kope_mcp.models import CompileResult, DeviceList, ProfileReport, TestReport
from kope_mcp.tools._context import AGENT_LABEL_DOC, APPENDS, AppState, agent_info, app_state, call_service
from kope_mcp.tools.views import ui_meta
from kope_mcp.views import SESSION_URI

KernelId = Annotated[str, Field(description="The kernel_id returned by compile_kernel.")]


def register(server: MCPServer[Any]) -> None:
    @server.tool(
        name="compile_kernel",
        title="Compile a candidate kernel",
        annotations=APPENDS,
    )
    async def compile_kernel(
        ctx: Context[AppState],
        task_id: Annotated[str, Field(description="The task this kernel implements (see list_tasks).")],
        source: Annotated[str, Field(description="The complete source defining `kernel` in the backend's language "
                                     "(at most 256 KiB).")],
        backend: Annotated[str, Field(description="'c' (gcc, runs on this CPU), 'triton' (a Python module with "
                                      "@triton.jit kernels and a launcher `kernel`), 'cuda' (CUDA C++ with an "
                                      "extern \"C\" host `kernel`); get_task lists a task's backends.")] = "c",
        session_id: Annotated[str | None, Field(description="Continue this session; omit to start one.")] = None,
        parent_id: Annotated[str | None, Field(
            description="The kernel this one was derived from; default: the session's previous kernel.")] = None,
        strategy: Annotated[str | None, Field(
            description="The optimisation this attempt applies, e.g. 'OpenMP over rows', 'unroll by 4'.")] = None,
        flags: Annotated[list[str] | None, Field(
            description="Extra compiler flags from the backend's allow-list, e.g. ['-O3', '-march=native', "
                        "'-fopenmp'] for c, ['--use_fast_math'] for cuda; none for triton.")
        ] = None,
        agent: Annotated[str | None, Field(description=AGENT_LABEL_DOC)] = None,
        target_arch: Annotated[str | None, Field(
            description="GPU backends: the architecture to compile for, e.g. 'sm_80', 'sm_90'; default: the GPU "
                        "present, else the backend's default.")] = None,
        device: Annotated[str | None, Field(
            description="Where to build, test and profile: a device id from list_devices (e.g. 'c@gpu-box', a "
                        "cluster worker's); default: this server's own device for `backend`. run_tests and "
                        "profile_kernel follow the build.")] = None,
    ) -> CompileResult:
        """Compile a candidate kernel for a task. Builds are cached by content (same source and flags: cached).

        Returns kernel_id, session_id, ok, diagnostics with line numbers in your source, and the trimmed log; for
        GPU backends also target_arch and per kernel its registers, shared memory and spills. A compile error is a
        normal result (ok=false): fix the lines it names and compile again with the same session_id. A session
        stays on one backend. Next on success: run_tests(kernel_id).
        """
        return await call_service(ctx, app_state(ctx).workbench.compile_kernel, task_id=task_id, source=source,
                                  backend=backend, session_id=session_id, parent_id=parent_id, strategy=strategy,
                                  flags=flags, progress=True, agent=agent_info(ctx, agent), target_arch=target_arch,
                                  device=device)

    @server.tool(
        name="list_devices",
        title="List the devices kernels can run on",
        annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False),
    )
    async def list_devices(ctx: Context[AppState]) -> DeviceList:
        """Where kernels can be compiled, tested and profiled: this server's own backends, and, when it serves a
        cluster, every worker's devices (id 'backend@worker'), each with its hardware key (results are recorded
        and ranked per hardware), what it can do, and how many profiles are running or queued on it.

        Next: compile_kernel(..., device=id) to work on a device; results on different hardware are separate
        sessions. A device that stops answering drops out of this list until its worker is back.
        """
        return await call_service(ctx, app_state(ctx).workbench.list_devices)

    @server.tool(
        name="run_tests",
        title="Test a kernel against the reference",
        annotations=ToolAnnotations(read_only_hint=False, idempotent_hint=True, open_world_hint=False),
    )
    async def run_tests(ctx: Context[AppState], kernel_id: KernelId) -> TestReport:
        """Run the kernel on every correctness case of its task (2 input seeds each, sizes including 1 and odd
        tails, values that break naive formulas) and on one case drawn for this run near the profiling size, in
        a sandbox, and compare with the float64 reference within the task's tolerance.

        Every buffer sits between guard zones: a write outside one is out_of_bounds_write. Triton kernels run in
        Triton's interpreter on the CPU where the server has no GPU (correctness only, no drawn case).

        Returns passed, a failure kind (not_compiled, crash, timeout, mismatch, nan, input_modified,
        wrong_shape, load_error, out_of_bounds_write) and per case the max abs/rel error, mismatches, unwritten
        elements and the first bad index. Next: fix and recompile when it failed; profile_kernel(kernel_id) when
        it passed.
        """
        return await call_service(ctx, app_state(ctx).workbench.run_tests, kernel_id=kernel_id, progress=True)

    @server.tool(
        name="profile_kernel",
        title="Measure a tested kernel",
        annotations=ToolAnnotations(read_only_hint=False, idempotent_hint=False, open_world_hint=False),
        meta=ui_meta(SESSION_URI),
    )
    async def profile_kernel(
        ctx: Context[AppState],
        kernel_id: KernelId,
        deterministic: Annotated[bool, Field(
            description="Also count instructions and cache misses with valgrind (repeatable, slower).")] = False,
        time_reference: Annotated[bool, Field(
            description="Also time the Python reference (speedup_vs_reference). False measures only kernel and "
                        "baseline, about a third faster; tasks without a C baseline always time the reference."
        )] = True,
    ) -> ProfileReport:
        """Time a kernel that passed run_tests at the task's profiling size, interleaved with the naive baseline
        and the numpy reference in one pinned sandboxed process, until the timings are stable (about 3 s). The
        timed calls take input sets drawn fresh and secretly for this profile, into fresh output buffers, and
        every output is checked. Profiles of all clients queue for one slot, shared fairly; a wait is reported.

        Returns median, IQR, 95% CI and n for each, speedup vs the baseline (with CI) and vs the reference,
        GFLOP/s, GB/s, the hardware, warnings, and `suspect` (a result never taught to others as a win). A kernel
        wrong at the profiling size comes back with failure="wrong_at_profile_size" and no speedup: fix it as you
        would a failed test. Refuses a kernel that was not tested or failed. Next: keep it if its CI lies above
        your best, then try the next idea.
        """
        return await call_service(ctx, app_state(ctx).workbench.profile_kernel, kernel_id=kernel_id,
                                  deterministic=deterministic, time_reference=time_reference, progress=True,
                                  agent=agent_info(ctx))
