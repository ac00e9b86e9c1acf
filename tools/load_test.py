#!/usr/bin/env python3
"""Load test: N MCP clients over streamable HTTP doing mixed record / query / compile against one server.

    python tools/load_test.py                       # 8 clients, 60 s, a fresh home and server on loopback
    python tools/load_test.py --clients 16 --seconds 120
    python tools/load_test.py --kill-at 20          # kill -9 the server 20 s in, restart it, keep going
    python tools/load_test.py --profilers 4 --seconds 300   # 4 of the clients compile, test and profile in a loop

It starts `kope serve --transport http --port 0` on a temporary KOPE_HOME (so the figures include the real
HTTP stack and the real database), runs the clients for a bounded time, stops the server, then opens the
database and checks that every acknowledged write (each record_experience id, each compiled kernel id) is
there. Prints throughput, latency percentiles per operation, errors, lost writes (the target is zero), and the
server's resident memory sampled every half second (median and peak; a queued profile must not hold an input
pool, so the peak stays near one profile's whatever the queue).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.types import Implementation

from kope_mcp.app import daemon
from kope_mcp.memory.store import KuzuExperienceStore

VECTOR_ADD = """#include <stdint.h>
void kernel(const float *a, const float *b, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}
"""
TASKS = ("relu", "softmax", "matmul", "sum_reduce", "layernorm", "gelu", "conv2d", "transpose")
OPS = (("record", 0.45), ("query", 0.45), ("compile", 0.10))


class Stats:
    def __init__(self) -> None:
        self.rss_mb: list[float] = []
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.errors: list[str] = []
        self.lessons: list[str] = []
        self.kernels: list[str] = []


def start_server(home: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "KOPE_HOME": str(home), "KOPE_EMBEDDINGS": os.environ.get("KOPE_EMBEDDINGS", "off")}
    server = subprocess.Popen([sys.executable, "-m", "kope_mcp", "serve", "--transport", "http", "--port", "0",
                               "--log-level", "WARNING"], env=env, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 90
    while daemon.running(home) is None:
        if server.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the server did not start (exit code {server.poll()})")
        time.sleep(0.05)
    return server


async def sample_rss(home: Path, until: float, stats: Stats) -> None:
    while time.monotonic() < until:
        state = daemon.running(home)
        try:
            status = Path(f"/proc/{state.pid}/status").read_text() if state is not None else ""
        except OSError:
            status = ""
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                stats.rss_mb.append(int(line.split()[1]) / 1024)
        await anyio.sleep(0.5)


async def connected(home: Path, name: str, until: float, stats: Stats, body: Any) -> None:
    """Run ``body(client)`` on a connection to the home's server until ``until``, connecting again after every
    failure (a server killed and restarted included), each failure counted."""
    while time.monotonic() < until:
        state = daemon.running(home)
        if state is None:  # restarting after a kill: wait for the new server
            await anyio.sleep(0.1)
            continue
        transport = streamable_http_client(state.url + "/mcp", http_client=create_mcp_http_client(
            headers={"Authorization": f"Bearer {state.token}"} if state.token else {}))
        try:
            async with Client(transport, client_info=Implementation(name=name, version="1")) as client:
                await body(client)
        except Exception as exc:  # a load test reports every failure, whatever it is, and carries on
            while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
                exc = exc.exceptions[0]  # the SDK's task groups wrap the transport error that matters
            stats.errors.append(f"connection: {type(exc).__name__}: {str(exc)[:160]}")
            await anyio.sleep(0.2)


def _failed(stats: Stats, op: str, result: Any) -> bool:
    if result.is_error or result.structured_content is None:
        stats.errors.append(f"{op}: {result.content[0].text[:160] if result.content else '?'}")
        return True
    return False


async def profile_loop(index: int, home: Path, until: float, stats: Stats, seed: int) -> None:
    """Compile a fresh vector_add, test it, profile it; again until the end (profiles queue on the one device)."""
    rng = random.Random(seed * 1000 + index)

    async def body(client: Client) -> None:
        while time.monotonic() < until:
            start = time.perf_counter()
            compiled = await _one(client, "compile", "vector_add", index, rng, None)
            if _failed(stats, "compile", compiled):
                continue
            kernel = compiled.structured_content["kernel_id"]
            stats.kernels.append(kernel)
            for op, tool, args in (("test", "run_tests", {"kernel_id": kernel}),
                                   ("profile", "profile_kernel", {"kernel_id": kernel, "time_reference": False})):
                if _failed(stats, op, await client.call_tool(tool, args)):
                    break
            stats.latency["profile loop"].append(time.perf_counter() - start)

    await connected(home, f"profiler-{index}", until, stats, body)


async def client_loop(index: int, home: Path, until: float, stats: Stats, seed: int) -> None:
    rng = random.Random(seed * 1000 + index)
    names, weights = zip(*OPS, strict=True)
    session_id: str | None = None

    async def body(client: Client) -> None:
        nonlocal session_id
        while time.monotonic() < until:
            op = rng.choices(names, weights)[0]
            task = rng.choice(TASKS)
            start = time.perf_counter()
            result = await _one(client, op, task, index, rng, session_id)
            stats.latency[op].append(time.perf_counter() - start)
            if _failed(stats, op, result):
                continue
            data: dict[str, Any] = result.structured_content
            if op == "record":
                stats.lessons.append(data["experience_id"])
            elif op == "compile":
                stats.kernels.append(data["kernel_id"])
                session_id = data["session_id"]

    await connected(home, f"load-{index}", until, stats, body)


async def _one(client: Client, op: str, task: str, index: int, rng: random.Random, session_id: str | None) -> Any:
    if op == "record":
        return await client.call_tool("record_experience", {
            "task_id": task, "strategy": rng.choice(["unroll by 4", "OpenMP over rows", "blocking 64", "AVX2"]),
            "lesson": f"client {index} observation {rng.random():.6f} on {task}", "agent": f"load {index}"})
    if op == "query":
        return await client.call_tool("query_experience", {"query": f"how to speed up {task}", "task_id": task,
                                                           "token_budget": 1500})
    source = VECTOR_ADD + f"// client {index} variant {rng.random():.9f}\n"  # a new source: a real gcc run
    args = {"task_id": "vector_add", "source": source, "strategy": "plain loop", "agent": f"load {index}"}
    if session_id:
        args["session_id"] = session_id
    return await client.call_tool("compile_kernel", args)


def _percentiles(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3  # noqa: E731
    return f"p50 {pick(0.5):7.1f}  p95 {pick(0.95):7.1f}  p99 {pick(0.99):7.1f}  max {ordered[-1] * 1e3:7.1f} ms"


def verify(home: Path, stats: Stats) -> tuple[int, int]:
    store = KuzuExperienceStore(home / "memory.kuzu")
    try:
        lost_lessons = sum(1 for lid in stats.lessons if not store.has_node("Lesson", "lesson_id", lid))
        lost_kernels = sum(1 for kid in stats.kernels if not store.has_node("Attempt", "kernel_id", kid))
    finally:
        store.close()
    return lost_lessons, lost_kernels


async def run(args: argparse.Namespace) -> int:
    home = Path(args.home or tempfile.mkdtemp(prefix="kope-load-"))
    server = start_server(home)
    stats = Stats()
    start = time.monotonic()
    until = start + args.seconds
    kills = 0
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(sample_rss, home, until, stats)
            for i in range(args.clients):
                loop = profile_loop if i < args.profilers else client_loop
                tg.start_soon(loop, i, home, until, stats, args.seed)
            if args.kill_at is not None:
                await anyio.sleep(args.kill_at)
                os.kill(server.pid, signal.SIGKILL)
                server.wait()
                kills += 1
                server = await anyio.to_thread.run_sync(start_server, home)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    elapsed = time.monotonic() - start
    total = sum(len(v) for v in stats.latency.values())
    print(f"{args.clients} clients, {elapsed:.1f} s, {kills} kill(s) -9 of the server; home {home}")
    print(f"throughput: {total / elapsed:.1f} calls/s ({total} calls)")
    for op in [name for name, _ in OPS] + (["profile loop"] if args.profilers else []):
        values = stats.latency[op]
        mean = statistics.mean(values) * 1e3 if values else 0.0
        print(f"  {op:<8} n={len(values):<6} mean {mean:7.1f} ms  {_percentiles(values)}")
    if stats.rss_mb:
        print(f"server resident memory: median {statistics.median(stats.rss_mb):.0f} MB, peak "
              f"{max(stats.rss_mb):.0f} MB ({len(stats.rss_mb)} samples); load average {os.getloadavg()[0]:.1f}")
    print(f"errors: {len(stats.errors)}")
    for message in sorted(set(stats.errors))[:10]:
        print(f"  {message}")
    lost_lessons, lost_kernels = verify(home, stats)
    print(f"acknowledged writes: {len(stats.lessons)} lessons, {len(stats.kernels)} kernels; "
          f"lost: {lost_lessons} lessons, {lost_kernels} kernels")
    return 0 if lost_lessons == lost_kernels == 0 and (kills or not stats.errors) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--kill-at", type=float, help="kill -9 the server this many seconds in, then restart it")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profilers", type=int, default=0,
                        help="how many of the clients compile, test and profile vector_add in a loop")
    parser.add_argument("--home", help="KOPE_HOME to use (default: a fresh temporary one)")
    sys.exit(anyio.run(run, parser.parse_args()))
