"""The triton and cuda backends through the SDK's in-process Client, on this machine (a GPU is not needed: Triton
compiles ahead of time and runs in its interpreter; nvcc compiles)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from mcp import Client

from kope_mcp.app.server import build_server
from kope_mcp.targets.cuda import nvcc_version
from kope_mcp.targets.gpu import detect_gpu
from kope_mcp.targets.triton import triton_version
from tests.conftest import make_settings

needs_triton = pytest.mark.skipif(triton_version() is None, reason="triton is not installed (pip install '.[triton]')")
needs_nvcc = pytest.mark.skipif(nvcc_version() is None, reason="nvcc is not installed")
no_gpu = pytest.mark.skipif(detect_gpu() is not None, reason="checks the behaviour without a GPU")

UNMASKED_TAIL = '''
import triton
import triton.language as tl


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(a_ptr + offs) + tl.load(b_ptr + offs))


def kernel(a, b, out, n):
    add_kernel[(triton.cdiv(n, 256),)](a, b, out, n, BLOCK=256)
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    return build_server(make_settings(tmp_path_factory.mktemp("gpu-home")))


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


async def error_of(client: Client, tool: str, **arguments: Any) -> str:
    result = await client.call_tool(tool, arguments)
    assert result.is_error
    return result.content[0].text  # type: ignore[union-attr]


def test_list_and_get_task_show_each_tasks_backends(server):
    async def body():
        async with Client(server) as client:
            listing = await call(client, "list_tasks", family="matmul")
            assert any(line.startswith("matmul (") and "[backends: c, " in line for line in listing["tasks"])
            assert {"c", "triton", "cuda"} <= set(listing["backends"])
            task = await call(client, "get_task", task_id="matmul")
            by_backend = {t["backend"]: t for t in task["targets"]}
            assert by_backend["triton"]["signature"].startswith("def kernel(A: torch.Tensor, B: torch.Tensor")
            assert "@triton.jit" in by_backend["triton"]["baseline_source"]
            assert by_backend["cuda"]["signature"].startswith('extern "C" void kernel(const float *A')
            assert set(task["backends"]) >= {"c", "triton", "cuda"}
            c_only = await call(client, "get_task", task_id="conv2d")
            assert c_only["backends"] == ["c"] and c_only["targets"] == []
    anyio.run(body)


@needs_triton
@no_gpu
@pytest.mark.slow
def test_a_triton_kernel_compiles_for_a_gpu_and_is_tested_in_the_interpreter(server):
    async def body():
        async with Client(server) as client:
            task = await call(client, "get_task", task_id="vector_add")
            source = next(t["baseline_source"] for t in task["targets"] if t["backend"] == "triton")
            compiled = await call(client, "compile_kernel", task_id="vector_add", source=source, backend="triton",
                                  target_arch="sm_80")
            assert compiled["ok"], compiled["log"]
            assert compiled["target_arch"] == "sm_80"
            assert compiled["resources"][0]["name"] == "add_kernel" and compiled["resources"][0]["registers"] > 0
            tested = await call(client, "run_tests", kernel_id=compiled["kernel_id"])
            assert tested["passed"], tested["message"]
            assert any("interpreter" in w for w in tested["warnings"])
            refused = await error_of(client, "profile_kernel", kernel_id=compiled["kernel_id"])
            assert refused.startswith("no_device:") and "GPU" in refused
    anyio.run(body)


@needs_triton
def test_a_triton_kernel_with_an_unmasked_tail_fails_as_an_out_of_bounds_write(server):
    async def body():
        async with Client(server) as client:
            compiled = await call(client, "compile_kernel", task_id="vector_add", source=UNMASKED_TAIL,
                                  backend="triton")
            assert compiled["ok"], compiled["log"]
            tested = await call(client, "run_tests", kernel_id=compiled["kernel_id"])
            assert not tested["passed"]
            assert tested["failure"] == "out_of_bounds_write"
            assert "out after its end" in tested["message"]
    anyio.run(body)


@needs_triton
@pytest.mark.slow
def test_a_triton_frontend_error_points_at_the_users_line(server):
    source = UNMASKED_TAIL.replace("tl.load(b_ptr + offs))", "tl.load(b_ptr + offs) + undefined_name)")
    line = source.splitlines().index(next(s for s in source.splitlines() if "undefined_name" in s)) + 1

    async def body():
        async with Client(server) as client:
            compiled = await call(client, "compile_kernel", task_id="vector_add", source=source, backend="triton")
            assert not compiled["ok"]
            error = compiled["diagnostics"][0]
            assert error["line"] == line and "undefined_name" in error["message"]
            syntax = await call(client, "compile_kernel", task_id="vector_add", backend="triton",
                                source=UNMASKED_TAIL.replace("def kernel(a, b, out, n):", "def kernel(a, b, out, n)"))
            assert not syntax["ok"] and syntax["diagnostics"][0]["line"] == 12
            flags = await error_of(client, "compile_kernel", task_id="vector_add", source=UNMASKED_TAIL,
                                   backend="triton", flags=["-O3"])
            assert flags.startswith("refused_flag:")
            other = await error_of(client, "compile_kernel", task_id="conv2d", source=UNMASKED_TAIL,
                                   backend="triton")
            assert other.startswith("task_not_on_target:") and "c" in other
    anyio.run(body)


@needs_triton
@pytest.mark.slow
def test_an_exception_in_a_triton_launcher_is_a_crash_naming_the_case_and_line(server):
    source = UNMASKED_TAIL.replace("def kernel(a, b, out, n):\n",
                                   "def kernel(a, b, out, n):\n    if n == 7:\n        raise ValueError('seven')\n")

    async def body():
        async with Client(server) as client:
            compiled = await call(client, "compile_kernel", task_id="vector_add", source=source, backend="triton")
            assert compiled["ok"], compiled["log"]
            tested = await call(client, "run_tests", kernel_id=compiled["kernel_id"])
            assert tested["failure"] == "crash"
            assert "ValueError: seven" in tested["message"] and "line 14" in tested["message"]
            assert tested["cases"][0]["name"] == "seven"
    anyio.run(body)


@needs_nvcc
@no_gpu
def test_cuda_compiles_with_real_diagnostics_and_says_no_device_for_running(server):
    async def body():
        async with Client(server) as client:
            task = await call(client, "get_task", task_id="vector_add")
            source = next(t["baseline_source"] for t in task["targets"] if t["backend"] == "cuda")
            broken = source.replace("a[i] + b[i]", "a[i] + b[j]")
            failed = await call(client, "compile_kernel", task_id="vector_add", source=broken, backend="cuda")
            assert not failed["ok"]
            line = broken.splitlines().index(next(s for s in broken.splitlines() if "b[j]" in s)) + 1
            assert any(d["line"] == line and '"j"' in d["message"] for d in failed["diagnostics"])
            compiled = await call(client, "compile_kernel", task_id="vector_add", source=source, backend="cuda",
                                  flags=["--use_fast_math"], target_arch="sm_90")
            assert compiled["ok"], compiled["log"]
            assert compiled["target_arch"] == "sm_90" and compiled["resources"][0]["registers"] > 0
            refused = await error_of(client, "run_tests", kernel_id=compiled["kernel_id"])
            assert refused.startswith("no_device:")
            flag = await error_of(client, "compile_kernel", task_id="vector_add", source=source, backend="cuda",
                                  flags=["-Xcompiler=-fplugin=evil.so"])
            assert flag.startswith("refused_flag:")
    anyio.run(body)


@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_the_gpu_demos_broken_kernel_fails_at_its_line_and_its_fix_compiles(server, backend):
    from kope_mcp.app.demo import plan_for

    if (triton_version() if backend == "triton" else nvcc_version()) is None:
        pytest.skip(f"no {backend} toolchain here")
    plan = plan_for(backend)

    async def body():
        async with Client(server) as client:
            broken = await call(client, "compile_kernel", task_id="matmul", source=plan.broken, backend=backend)
            assert not broken["ok"] and any(d["line"] > 0 and d["severity"] == "error" for d in broken["diagnostics"])
            fixed = await call(client, "compile_kernel", task_id="matmul", source=plan.fast, backend=backend)
            assert fixed["ok"], fixed["log"]
    anyio.run(body)
