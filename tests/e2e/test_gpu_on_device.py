"""The GPU backends on a real device, through the SDK's in-process Client: run_tests and profile_kernel on the GPU
(skipped without one: `pytest -m gpu` on a GPU machine)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from mcp import Client

from kope_mcp.app.demo_sources import CUDA_TILED_MATMUL
from kope_mcp.app.server import build_server
from kope_mcp.settings import KopeSettings
from tests.conftest import make_settings
from tests.e2e.test_gpu_targets_over_mcp import call, error_of

pytestmark = pytest.mark.gpu

WILD_STORE = r'''
#include <stdint.h>
__global__ void add(const float *a, const float *b, float *out, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i + (1ll << 40)] = a[i] + b[i];
}
extern "C" void kernel(const float *a, const float *b, float *out, int64_t n) {
    add<<<(unsigned)((n + 255) / 256), 256>>>(a, b, out, n);
}
'''

TOO_MANY_THREADS = WILD_STORE.replace("out[i + (1ll << 40)]", "out[i]").replace("(n + 255) / 256), 256",
                                                                               "(n + 4095) / 4096), 4096")

SPINS = WILD_STORE.replace("if (i < n) out[i + (1ll << 40)] = a[i] + b[i];",
                           "while (clock64() >= 0) {} if (i < n) out[i] = a[i] + b[i];")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    return build_server(make_settings(tmp_path_factory.mktemp("gpu-device-home")))


async def compiled(client: Client, task: str, source: str, backend: str) -> str:
    built = await call(client, "compile_kernel", task_id=task, source=source, backend=backend)
    assert built["ok"], built["log"]
    return str(built["kernel_id"])


def test_the_triton_baseline_runs_and_is_timed_on_the_gpu_at_its_gpu_size(server):
    async def body():
        async with Client(server) as client:
            task = await call(client, "get_task", task_id="vector_add")
            assert task["gpu_profile_case"]["sizes"] == {"n": 1 << 25}
            source = next(t["baseline_source"] for t in task["targets"] if t["backend"] == "triton")
            kernel_id = await compiled(client, "vector_add", source, "triton")
            tested = await call(client, "run_tests", kernel_id=kernel_id)
            assert tested["passed"], tested["message"]
            assert tested["drawn_case_seed"] is not None  # on a device the case near the profiling size is drawn
            profiled = await call(client, "profile_kernel", kernel_id=kernel_id)
            assert profiled["failure"] is None, profiled["message"]
            assert profiled["case"]["sizes"] == {"n": 1 << 25}
            assert profiled["hardware"]["key"].startswith("cuda/") and "no-gpu" not in profiled["hardware"]["key"]
            assert profiled["same_code_as_baseline"]  # the baseline's own code: never labelled effective
    anyio.run(body)


def test_a_tiled_cuda_matmul_is_measured_effective_against_the_naive_one(server):
    async def body():
        async with Client(server) as client:
            kernel_id = await compiled(client, "matmul", CUDA_TILED_MATMUL, "cuda")
            tested = await call(client, "run_tests", kernel_id=kernel_id)
            assert tested["passed"], tested["message"]
            profiled = await call(client, "profile_kernel", kernel_id=kernel_id)
            assert profiled["failure"] is None, profiled["message"]
            assert profiled["speedup_vs_baseline_ci95"][0] > 1.05, profiled
            assert not profiled["suspect"], profiled["suspect_reasons"]
    anyio.run(body)


@pytest.mark.parametrize(("source", "expected"), [
    (WILD_STORE, "CUDA_ERROR_ILLEGAL_ADDRESS"),
    # CUDA 13 refuses 4,096 threads a block as cudaErrorInvalidValue (measured on an H200), 12 as ...Configuration.
    (TOO_MANY_THREADS, "the launch failed: cudaError"),
], ids=["illegal_address", "refused_launch"])
def test_a_cuda_fault_is_the_kernels_crash_named_with_its_case(server, source: str, expected: str):
    async def body():
        async with Client(server) as client:
            kernel_id = await compiled(client, "vector_add", source, "cuda")
            tested = await call(client, "run_tests", kernel_id=kernel_id)
            assert tested["failure"] == "crash" and expected in tested["message"], tested["message"]
            assert tested["cases"] and tested["cases"][0]["name"] in tested["message"]
    anyio.run(body)


def test_a_kernel_that_never_finishes_is_a_timeout(tmp_path):
    server = build_server(KopeSettings.from_env(home=tmp_path, test_timeout_s=2.0, embeddings=False))

    async def body():
        async with Client(server) as client:
            kernel_id = await compiled(client, "vector_add", SPINS, "cuda")
            tested = await call(client, "run_tests", kernel_id=kernel_id)
            assert tested["failure"] == "timeout", tested["message"]
    anyio.run(body)


def test_a_gpu_the_run_cannot_have_is_the_servers_error_not_the_kernels(tmp_path):
    server = build_server(KopeSettings.from_env(home=tmp_path, gpu=63, embeddings=False))

    async def body() -> Any:
        async with Client(server) as client:
            task = await call(client, "get_task", task_id="relu")
            source = next(t["baseline_source"] for t in task["targets"] if t["backend"] == "cuda")
            kernel_id = await compiled(client, "relu", source, "cuda")
            refused = await error_of(client, "run_tests", kernel_id=kernel_id)
            assert refused.startswith("device_unavailable:") and "/dev/nvidia63" in refused
    anyio.run(body)


@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_the_gpu_demo_teaches_a_win(tmp_path, backend):
    import os
    import subprocess
    import sys

    from kope_mcp.app import daemon

    env = {**os.environ, "KOPE_HOME": str(tmp_path / "home"), "KOPE_EMBEDDINGS": "off"}
    try:
        done = subprocess.run([sys.executable, "-m", "kope_mcp", "demo", "--backend", backend], env=env,
                              capture_output=True, text=True, timeout=300, check=False)
    finally:
        daemon.stop(tmp_path / "home")
    assert done.returncode == 0, done.stderr[-1500:]
    assert "speedup vs naive baseline" in done.stdout and "cuda/" in done.stdout
