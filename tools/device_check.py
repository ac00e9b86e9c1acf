#!/usr/bin/env python3
"""The GPU targets end to end on this machine: compile, test and profile a naive and a tiled matmul with the
triton and cuda backends at the task's GPU size, and the vector_add baseline against itself (A/A: a bandwidth-bound
task, whose speedup must be 1 within ~3%), through MCP (the SDK's in-process client against a real server), then the
tiled kernels' times beside torch's float32 matmul (cuBLAS, TF32 off) at the same size; it prints what happened at
every step, refusals included. One command, a few minutes:

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

from kope_mcp.app.demo_sources import CUDA_TILED_MATMUL, TRITON_TILED_MATMUL


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


async def check(home: Path, on_gpu: bool) -> tuple[int, dict[str, float]]:
    from kope_mcp.app.server import build_server
    from kope_mcp.settings import KopeSettings

    server = build_server(KopeSettings.from_env(home=home, embeddings=False))
    failures = 0
    medians: dict[str, float] = {}
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
                    if not ok and ("no_device:" not in str(value) or on_gpu):
                        failures += 1
                    if ok and tool == "profile_kernel" and isinstance(value, dict) and not value.get("failure"):
                        medians[f"{backend} {label}"] = value["kernel"]["median_s"]
                        if label == "tiled" and not value["speedup_vs_baseline_ci95"][0] > 1.05:
                            print(f"{backend:6} tiled is not measured effective against the naive baseline")
                            failures += 1
                    if not ok or (tool == "run_tests" and not value["passed"]):  # type: ignore[index]
                        break
        failures += await same_against_itself(client, on_gpu)
    return failures, medians


async def same_against_itself(client: Client, on_gpu: bool) -> int:
    """A/A: each GPU backend's vector_add baseline profiled against itself; its speedup's CI must hold 1 and stay
    within 3% of it."""
    failures = 0
    ok, task, _ = await step(client, "get_task", task_id="vector_add")
    assert ok and isinstance(task, dict)
    print(f"vector_add profiling size here: {task.get('gpu_profile_case') if on_gpu else task['profile_case']}")
    for target in task["targets"]:
        backend, source = target["backend"], target["baseline_source"]
        ok, compiled, _ = await step(client, "compile_kernel", task_id="vector_add", source=source, backend=backend,
                                     strategy="A/A: the baseline itself")
        if not ok or not compiled["ok"]:  # type: ignore[index]
            print(f"{backend:6} A/A compile failed: {compiled}")
            failures += 1
            continue
        kernel_id = compiled["kernel_id"]  # type: ignore[index]
        ok, tested, _ = await step(client, "run_tests", kernel_id=kernel_id)
        if not ok or not tested["passed"]:  # type: ignore[index]
            print(f"{backend:6} A/A run_tests: {tested}")
            failures += int(ok or on_gpu)
            continue
        ok, value, seconds = await step(client, "profile_kernel", kernel_id=kernel_id)
        text = summary("profile_kernel", value) if ok and isinstance(value, dict) else str(value)
        print(f"{backend:6} A/A   profile_kernel {seconds:5.1f}s {text}")
        if ok and isinstance(value, dict) and not value.get("failure"):
            low, high = value["speedup_vs_baseline_ci95"]
            if abs(value["speedup_vs_baseline"] - 1) > 0.03 or not low <= 1.0 <= high:
                print(f"{backend:6} A/A is off: {value['speedup_vs_baseline']:.3f}x CI [{low:.3f}, {high:.3f}]")
                failures += 1
        elif ok or on_gpu:
            failures += 1
    return failures


def cublas_beside(medians: dict[str, float]) -> None:
    """torch's float32 matmul (TF32 off) at the task's GPU size, timed here with events, beside the kernels."""
    import torch

    from kope_mcp.tasks.registry import TaskRegistry

    sizes = TaskRegistry.default().get("matmul").spec.profile_for("gpu").sizes
    m, n, k = sizes["M"], sizes["N"], sizes["K"]
    a, b = torch.rand(m, k, device="cuda"), torch.rand(k, n, device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.matmul(a, b)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    best = sorted(times)[len(times) // 2]
    print(f"matmul {m}x{n}x{k}: torch fp32 (cuBLAS, TF32 off) {best * 1e6:.0f} us, {2 * m * n * k / best / 1e12:.1f} "
          "TFLOP/s (median of 20)")
    for name, median in sorted(medians.items()):
        print(f"  {name:14} {median * 1e6:8.0f} us  {2 * m * n * k / median / 1e12:6.1f} TFLOP/s  "
              f"{median / best:5.1f}x cuBLAS's time")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the KOPE_HOME and print where it is")
    args = parser.parse_args()
    from kope_mcp.targets.gpu import detect_gpu

    gpu = detect_gpu()
    print(f"machine: {platform.node()} {platform.machine()}; GPU: {json.dumps(gpu.__dict__) if gpu else 'none'}")
    started = time.monotonic()
    home = Path(tempfile.mkdtemp(prefix="kope-device-check-"))
    failures, medians = anyio.run(check, home, gpu is not None)
    if gpu is not None:
        cublas_beside(medians)
    print(f"done in {time.monotonic() - started:.0f} s; {failures} step(s) failed (without a GPU, no_device answers "
          f"are not failures){'; home ' + str(home) if args.keep else ''}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
