#!/usr/bin/env python3
"""The GPU targets end to end on this machine: compile, test and profile a naive and a tiled matmul with the
triton and cuda backends, through MCP (the SDK's in-process client against a real server), and print what
happened at every step, refusals included. One command, a few minutes:

    python tools/device_check.py            # uses a fresh KOPE_HOME in a temp dir
    python tools/device_check.py --keep     # and prints where it is

On a machine without a GPU it shows what works there (ahead-of-time compiles, the Triton interpreter) and the
`no_device:` answers; on a GPU machine it is the check that running and timing work on the device.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

TRITON_TILED_MATMUL = '''
import triton
import triton.language as tl


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k0 + rk)[None, :],
                    mask=(rm[:, None] < M) & ((k0 + rk)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k0 + rk)[:, None] * N + rn[None, :],
                    mask=((k0 + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b, input_precision="ieee")
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def kernel(A, B, C, M, N, K):
    grid = (triton.cdiv(M, 64), triton.cdiv(N, 64))
    matmul_kernel[grid](A, B, C, M, N, K, BM=64, BN=64, BK=32)
'''

CUDA_TILED_MATMUL = r'''
#include <stdint.h>
#define TILE 32

__global__ void matmul_tiled(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int64_t row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int64_t k0 = 0; k0 < K; k0 += TILE) {
        As[threadIdx.y][threadIdx.x] = (row < M && k0 + threadIdx.x < K) ? A[row * K + k0 + threadIdx.x] : 0.0f;
        Bs[threadIdx.y][threadIdx.x] = (col < N && k0 + threadIdx.y < K) ? B[(k0 + threadIdx.y) * N + col] : 0.0f;
        __syncthreads();
        for (int k = 0; k < TILE; k++) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    if (row < M && col < N) C[row * N + col] = acc;
}

extern "C" void kernel(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K) {
    dim3 threads(TILE, TILE), blocks((unsigned)((N + TILE - 1) / TILE), (unsigned)((M + TILE - 1) / TILE));
    matmul_tiled<<<blocks, threads>>>(A, B, C, M, N, K);
}
'''


async def step(client: Client, tool: str, **arguments: Any) -> tuple[bool, dict[str, Any] | str, float]:
    started = time.monotonic()
    result = await client.call_tool(tool, arguments)
    seconds = time.monotonic() - started
    if result.is_error:
        return False, result.content[0].text, seconds  # type: ignore[union-attr]
    assert result.structured_content is not None
    return True, result.structured_content, seconds


def summary(tool: str, value: dict[str, Any]) -> str:
    if tool == "compile_kernel":
        res = "; ".join(f"{r['name']}: {r['registers']} regs, {r['shared_bytes']} B smem" for r in value["resources"])
        errors = [f"line {d['line']}: {d['message']}" for d in value["diagnostics"] if d["severity"] == "error"]
        return (f"ok={value['ok']} arch={value['target_arch']} {res} {'; '.join(errors)[:300]}"
                f"{' warnings: ' + '; '.join(value['warnings']) if value['warnings'] else ''}")
    if tool == "run_tests":
        return f"passed={value['passed']} failure={value['failure']} {value['message'][:200]}"
    if value.get("failure"):
        return f"failure={value['failure']}: {value['message'][:300]}"
    kernel, baseline = value["kernel"]["median_s"] * 1e6, value["baseline"]["median_s"] * 1e6
    return (f"kernel {kernel:.1f} us, baseline {baseline:.1f} us, "
            f"speedup {value['speedup_vs_baseline']:.2f}x CI {value['speedup_vs_baseline_ci95']}, "
            f"{value.get('gflops') or 0:.1f} GFLOP/s on {value['hardware']['key']}")


async def check(home: Path) -> int:
    from kope_mcp.app.server import build_server
    from kope_mcp.settings import KopeSettings

    server = build_server(KopeSettings.from_env(home=home, embeddings=False))
    failures = 0
    async with Client(server) as client:
        ok, listing, _ = await step(client, "list_tasks", family="matmul")
        assert ok and isinstance(listing, dict)
        for name, status in listing["backends"].items():
            print(f"backend {name}: {status}")
        ok, task, _ = await step(client, "get_task", task_id="matmul")
        assert ok and isinstance(task, dict)
        naive = {t["backend"]: t["baseline_source"] for t in task["targets"]}
        for backend, tiled in (("triton", TRITON_TILED_MATMUL), ("cuda", CUDA_TILED_MATMUL)):
            for label, source in (("naive", naive.get(backend)), ("tiled", tiled)):
                if source is None:
                    print(f"{backend:6} {label:5} no source for this backend")
                    continue
                ok, compiled, seconds = await step(client, "compile_kernel", task_id="matmul", source=source,
                                                   backend=backend, strategy=f"{label} matmul")
                print(f"{backend:6} {label:5} compile_kernel {seconds:5.1f}s "
                      f"{summary('compile_kernel', compiled) if ok else compiled}")  # type: ignore[arg-type]
                if not ok or not compiled["ok"]:  # type: ignore[index]
                    failures += 1
                    continue
                kernel_id = compiled["kernel_id"]  # type: ignore[index]
                for tool in ("run_tests", "profile_kernel"):
                    ok, value, seconds = await step(client, tool, kernel_id=kernel_id)
                    text = summary(tool, value) if ok and isinstance(value, dict) else str(value)
                    print(f"{backend:6} {label:5} {tool:14} {seconds:5.1f}s {text}")
                    if ok and isinstance(value, dict) and (value.get("passed") is False or value.get("failure")):
                        failures += 1
                    if not ok and "no_device:" not in str(value):
                        failures += 1
                    if not ok or (tool == "run_tests" and not value["passed"]):  # type: ignore[index]
                        break
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the KOPE_HOME and print where it is")
    args = parser.parse_args()
    from kope_mcp.targets.gpu import detect_gpu

    gpu = detect_gpu()
    print(f"machine: {platform.node()} {platform.machine()}; GPU: {json.dumps(gpu.__dict__) if gpu else 'none'}")
    started = time.monotonic()
    home = Path(tempfile.mkdtemp(prefix="kope-device-check-"))
    failures = anyio.run(check, home)
    print(f"done in {time.monotonic() - started:.0f} s; {failures} step(s) failed (no_device answers are not "
          f"failures){'; home ' + str(home) if args.keep else ''}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
