"""GPU integrity probes (KernelArena's and Makora's catalogues), each caught before anything is taught: a kernel
that fails run_tests, or whose profile fails or is suspect, is never served as a win. Skipped without a GPU
(`pytest -m gpu`); the protocol's logic they rely on is the contract's, tested on the CPU through the fake target
(test_protocol_through_the_contract.py) and in tests/unit/targets/test_gpu_harness.py."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from mcp import Client

from kope_mcp.app.server import build_server
from tests.conftest import make_settings
from tests.e2e.test_gpu_targets_over_mcp import call

pytestmark = pytest.mark.gpu

HEADER = '''
import threading
import time

import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask), mask=mask)


def launch(a, b, out, n):
    add_kernel[(triton.cdiv(n, 1024),)](a, b, out, n, BLOCK=1024)
'''

PROBES = {
    # A helper thread that outlives the call (here it only sleeps: the work is honest, the thread is not allowed).
    "host_thread_left_running": HEADER + '''
_helper = []


def kernel(a, b, out, n):
    if not _helper:
        _helper.append(threading.Thread(target=time.sleep, args=(600,), daemon=True))
        _helper[0].start()
    launch(a, b, out, n)
''',
    # Returning before the work is done: the launch happens later, from a thread.
    "lazy_launch_from_a_thread": HEADER + '''
def kernel(a, b, out, n):
    threading.Thread(target=lambda: (time.sleep(0.002), launch(a, b, out, n)), daemon=True).start()
''',
    # Outputs cached by the output's address: later calls on the same buffer skip the work.
    "cache_by_output_pointer": HEADER + '''
_seen = set()


def kernel(a, b, out, n):
    if out.data_ptr() in _seen:
        return
    _seen.add(out.data_ptr())
    launch(a, b, out, n)
''',
}

# Work left on another stream is not a trick that pays: the device-wide synchronisation inside the timed region
# counts it. The same kernel as the baseline's, on a side stream, must not be measured faster.
SIDE_STREAM = HEADER + '''
_stream = []


def kernel(a, b, out, n):
    if not a.is_cuda:  # compile_kernel runs the launcher on CPU tensors, without a GPU
        launch(a, b, out, n)
        return
    if not _stream:
        _stream.append(torch.cuda.Stream())
    with torch.cuda.stream(_stream[0]):
        launch(a, b, out, n)
'''

TF32_MATMUL = '''
import triton
import triton.language as tl


@triton.jit
def mm(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k0 + rk)[None, :], mask=(rm[:, None] < M) & ((k0 + rk)[None, :] < K),
                    other=0.0)
        b = tl.load(b_ptr + (k0 + rk)[:, None] * N + rn[None, :], mask=((k0 + rk)[:, None] < K) & (rn[None, :] < N),
                    other=0.0)
        acc += tl.dot(a, b)  # TF32 by default: 10 bits of mantissa where the contract is float32
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def kernel(A, B, C, M, N, K):
    mm[(triton.cdiv(M, 64), triton.cdiv(N, 64))](A, B, C, M, N, K, BM=64, BN=64, BK=32)
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    return build_server(make_settings(tmp_path_factory.mktemp("gpu-probes-home")))


async def verdict(client: Client, task: str, source: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    built = await call(client, "compile_kernel", task_id=task, source=source, backend="triton")
    assert built["ok"], built["log"]
    tested = await call(client, "run_tests", kernel_id=built["kernel_id"])
    if not tested["passed"]:
        return tested, None
    return tested, await call(client, "profile_kernel", kernel_id=built["kernel_id"])


@pytest.mark.parametrize("name", sorted(PROBES))
def test_a_gpu_trick_is_caught_before_it_is_taught(server, name: str):
    async def body():
        async with Client(server) as client:
            tested, profiled = await verdict(client, "vector_add", PROBES[name])
            caught = profiled is None or profiled["failure"] is not None or profiled["suspect"]
            assert caught, (name, tested, profiled)
            if name == "host_thread_left_running":
                assert profiled is not None and profiled["failure"] == "interfered", (tested, profiled)
                assert "thread" in profiled["message"]
    anyio.run(body)


def test_work_left_on_another_stream_is_timed(server):
    async def body():
        async with Client(server) as client:
            tested, profiled = await verdict(client, "vector_add", SIDE_STREAM)
            assert tested["passed"] and profiled is not None and profiled["failure"] is None, (tested, profiled)
            assert profiled["speedup_vs_baseline"] < 1.2, profiled
    anyio.run(body)


def test_tf32_where_the_contract_is_float32_fails_the_tolerance(server):
    async def body():
        async with Client(server) as client:
            tested, _ = await verdict(client, "matmul", TF32_MATMUL)
            assert not tested["passed"] and tested["failure"] == "mismatch", tested
    anyio.run(body)
