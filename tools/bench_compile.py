#!/usr/bin/env python3
"""What does compile_kernel cost over the compiler itself? Side by side in one run, per round and task:

- raw gcc: the same compiler command kope runs (same flags, same prototype header), outside any sandbox;
- sandboxed build: the C target's compile alone (sandbox, read-back, sha256, symbol check, cache write);
- compile_kernel: the whole tool call through the SDK's in-process MCP client (validation, the sandboxed build,
  the attempt recorded in the Kùzu memory, the answer).

    python tools/bench_compile.py              # 15 rounds of vector_add, softmax, matmul
    python tools/bench_compile.py --rounds 31 --tasks matmul

Every compile is of a new source (a unique comment), so nothing is served from the build cache; the order of the
three ways alternates per round, so all see the same machine load. Calls are --gap seconds apart (default 0.1 s;
an agent thinks for seconds between compiles): the server prepares the next sandbox in the background after
each compile, and back-to-back calls would time that preparation in whichever call comes next (--gap 0 shows
it). Prints p50, p95 and the p50 ratio to raw gcc
per task, and the load average. Target (issue 14): compile_kernel <= 1.3x raw gcc.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import anyio

TASKS = ("vector_add", "softmax", "matmul")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def raw_gcc(compiler: str, header: str, source: str, flags: list[str]) -> float:
    from kope_mcp.targets.c import BASE_FLAGS

    with tempfile.TemporaryDirectory(prefix="kope-bench-gcc-") as work:
        Path(work, "kernel.c").write_text(source)
        Path(work, "kope_prototype.h").write_text(header)
        argv = [compiler, *BASE_FLAGS, "-fPIC", "-shared", "-fdiagnostics-color=never",
                "-Werror=implicit-function-declaration", "-Wl,--no-undefined", "-include", "kope_prototype.h",
                *flags, "kernel.c", "-o", "kernel.so", "-lm"]
        t0 = time.perf_counter()
        done = subprocess.run(argv, cwd=work, capture_output=True, check=False)
        seconds = time.perf_counter() - t0
    assert done.returncode == 0, done.stderr.decode()
    return seconds


async def main(rounds: int, tasks: list[str], gap: float) -> None:
    from mcp import Client

    from kope_mcp.app.server import build_server
    from kope_mcp.settings import KopeSettings
    from kope_mcp.targets.c import prototype_header

    home = Path(tempfile.mkdtemp(prefix="kope-bench-compile-"))
    settings = KopeSettings.from_env(home=home, embeddings=False)
    times: dict[tuple[str, str], list[float]] = defaultdict(list)
    async with Client(build_server(settings)) as client:
        state: Any = None
        sessions: dict[str, str] = {}

        async def through_mcp(task_id: str, source: str) -> float:
            args = {"task_id": task_id, "source": source, **({"session_id": sessions[task_id]}
                                                            if task_id in sessions else {})}
            t0 = time.perf_counter()
            result = await client.call_tool("compile_kernel", args)
            seconds = time.perf_counter() - t0
            assert not result.is_error and result.structured_content["ok"], result.content
            sessions[task_id] = result.structured_content["session_id"]
            return seconds

        # The workbench the server built, for the build-only figure (same target, same caches).
        from kope_mcp.services.workbench import Workbench
        state = Workbench(settings.model_copy(update={"home": home / "direct"}))
        target = state.targets["c"]
        for round_no in range(-1, rounds):  # round -1 warms the compiler's and the page cache
            for task_id in tasks:
                task = state.tasks.get(task_id)
                base = task.baseline_source
                ways = ["raw gcc", "sandboxed build", "compile_kernel"]
                if round_no % 2:
                    ways.reverse()
                for way in ways:
                    await anyio.sleep(gap)
                    source = base + f"\n// {uuid.uuid4()}\n"
                    if way == "raw gcc":
                        seconds = raw_gcc(settings.compiler, prototype_header(task), source, [])
                    elif way == "sandboxed build":
                        t0 = time.perf_counter()
                        build = await anyio.to_thread.run_sync(target.compile, task, source, [])
                        seconds = time.perf_counter() - t0
                        assert build.ok and not build.cached, build.log
                    else:
                        seconds = await through_mcp(task_id, source)
                    if round_no >= 0:
                        times[(task_id, way)].append(seconds)
        state.store.close()

    load = os.getloadavg()
    print(f"compile_kernel vs raw gcc, {rounds} rounds, {gap} s between calls, "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} CPUs")
    print(f"{'task':<12} {'way':<16} {'p50 ms':>8} {'p95 ms':>8} {'p50 / raw':>10}")
    for task_id in tasks:
        raw = statistics.median(times[(task_id, "raw gcc")])
        for way in ("raw gcc", "sandboxed build", "compile_kernel"):
            values = times[(task_id, way)]
            p50 = statistics.median(values)
            print(f"{task_id:<12} {way:<16} {p50 * 1e3:8.1f} {percentile(values, 0.95) * 1e3:8.1f} "
                  f"{p50 / raw:9.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--gap", type=float, default=0.1, help="seconds between calls (default 0.1)")
    args = parser.parse_args()
    anyio.run(main, args.rounds, args.tasks, args.gap)
