"""A cancelled call stops: its sandbox ends, its measurement slot is free for the next client, nothing of it is
recorded. In process, over stdio (through the proxy, which forwards the cancel to the daemon) and over HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.types import Implementation

from kope_mcp.app import daemon
from kope_mcp.app.server import build_server
from kope_mcp.settings import KopeSettings
from tests.transports import http_client

# Long enough that a profile which kept measuring after its cancel would hold the next one up for many seconds.
CAP_S = 30.0
# Far under what the slow kernel's measurement takes, far over what ending a run takes (a kill and the worker
# thread's return: milliseconds).
FREED_WITHIN_S = 3.0

# Correct, and slow at the profiling size only (1.5 s a call: a measurement of many seconds), quick in the tests.
SLOW_RELU = r"""
#include <stdint.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

void kernel(const float *x, float *y, int64_t n) {
    if (n >= (1 << 22)) {
        double until = now() + 1.5;
        while (now() < until) {
        }
    }
    for (int64_t i = 0; i < n; i++) {
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
    }
}
"""


def stdio_params(home: Path) -> StdioServerParameters:
    env = {**os.environ, "KOPE_HOME": str(home), "KOPE_EMBEDDINGS": "off", "KOPE_PROFILE_S": str(CAP_S)}
    return StdioServerParameters(command=sys.executable, args=["-m", "kope_mcp", "serve", "--log-level", "WARNING"],
                                 env=env)


async def passing_kernel(client: Client, source: str | None = None) -> str:
    task = (await client.call_tool("get_task", {"task_id": "relu"})).structured_content
    assert task is not None
    arguments = {"task_id": "relu", "source": source or task["baseline_source"], "flags": ["-O2"]}
    compiled = (await client.call_tool("compile_kernel", arguments)).structured_content
    assert compiled is not None and compiled["ok"], compiled
    tested = (await client.call_tool("run_tests", {"kernel_id": compiled["kernel_id"]})).structured_content
    assert tested is not None and tested["passed"], tested
    return str(compiled["kernel_id"])


async def speedups(client: Client) -> dict[str, Any]:
    history = json.loads((await client.read_resource("kope://memory/history.json")).contents[0].text)
    return {item["id"]: item.get("speedup") for item in history["items"]}


async def cancel_then_profile(first: Client, second: Client) -> dict[str, Any]:
    """Cancel `first`'s profile once it measures; `second` profiles at once. What the second one saw."""
    cancelled_kernel, next_kernel = await passing_kernel(first, SLOW_RELU), await passing_kernel(second)
    measuring = anyio.Event()

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        if message and message.startswith("measuring"):
            measuring.set()

    async def doomed() -> None:
        await first.call_tool("profile_kernel", {"kernel_id": cancelled_kernel, "time_reference": False},
                              progress_callback=on_progress)

    with anyio.fail_after(240):
        async with anyio.create_task_group() as tg:
            tg.start_soon(doomed)
            await measuring.wait()
            await anyio.sleep(0.5)  # well inside its measurement
            cancelled_at = time.monotonic()
            tg.cancel_scope.cancel()
        ended_s = time.monotonic() - cancelled_at  # the cancelled call has returned: its handler let go
        cancelled_at = time.monotonic()
        result = await second.call_tool("profile_kernel", {"kernel_id": next_kernel, "time_reference": False})
        elapsed = time.monotonic() - cancelled_at
        assert not result.is_error, result.content
        recorded = await speedups(second)
    return {"profile": result.structured_content, "elapsed_s": elapsed, "ended_s": ended_s, "recorded": recorded,
            "cancelled": cancelled_kernel, "next": next_kernel}


def check(seen: dict[str, Any]) -> None:
    profile = seen["profile"]
    assert profile["failure"] is None, profile
    assert seen["ended_s"] < FREED_WITHIN_S, seen  # the call ended at once, not when its measurement would have
    assert profile["waited_s"] < FREED_WITHIN_S, seen  # and the slot was let go
    assert seen["recorded"].get(seen["cancelled"]) is None, seen  # nothing of the cancelled profile
    assert seen["recorded"].get(seen["next"]) is not None, seen


def test_a_cancelled_profile_in_process_frees_the_slot_at_once_and_records_nothing(tmp_path):
    settings = KopeSettings.from_env(home=tmp_path / "home", test_timeout_s=8.0, profile_time_cap_s=CAP_S,
                                     embeddings=False)
    server = build_server(settings)

    async def body() -> dict[str, Any]:
        async with Client(server) as first, Client(server) as second:
            return await cancel_then_profile(first, second)

    seen = anyio.run(body)
    check(seen)
    # The second profile ran its own full cap: had the first kept measuring, it would have waited for it too.
    assert seen["elapsed_s"] < CAP_S * 2 + 30, seen


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_a_cancel_reaches_the_daemon_which_ends_the_run_and_records_nothing(tmp_path, monkeypatch, transport):
    home = tmp_path / "home"
    monkeypatch.setenv("KOPE_PROFILE_S", str(CAP_S))  # the daemon a client starts takes the client's settings
    monkeypatch.setenv("KOPE_EMBEDDINGS", "off")

    def client(name: str) -> Client:
        if transport == "stdio":
            return Client(stdio_params(home), client_info=Implementation(name=name, version="1"))
        return http_client(home, name)

    async def body() -> dict[str, Any]:
        async with client("first") as first, client("second") as second:
            return await cancel_then_profile(first, second)

    try:
        seen = anyio.run(body)
    finally:
        with contextlib.suppress(daemon.DaemonError):
            daemon.stop(home)
    check(seen)


@pytest.mark.slow
def test_a_stdio_client_that_goes_away_mid_profile_has_its_run_ended_by_the_daemon(tmp_path, monkeypatch):
    # An editor closed with a profile in flight: the proxy's stdin ends, it must tell the daemon to stop the call.
    home = tmp_path / "home"
    monkeypatch.setenv("KOPE_PROFILE_S", str(CAP_S))
    monkeypatch.setenv("KOPE_EMBEDDINGS", "off")
    errlog = (tmp_path / "client.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "kope_mcp", "serve"],  # its log at the default level, INFO
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errlog,
                            env={**os.environ, "KOPE_HOME": str(home)})
    assert proc.stdin is not None and proc.stdout is not None
    lines = iter(proc.stdout.readline, b"")

    def send(message: dict[str, Any]) -> None:
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]

    def until(test: Any) -> dict[str, Any]:
        for line in lines:  # bounded by the watchdog below
            message = json.loads(line)
            if test(message):
                return message
        raise AssertionError("the proxy closed its stdout")

    def call(request_id: int, name: str, arguments: dict[str, Any], token: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"name": name, "arguments": arguments}
        if token:
            params["_meta"] = {"progressToken": token}
        send({"id": request_id, "method": "tools/call", "params": params})
        if token:
            return until(lambda m: m.get("method") == "notifications/progress"
                         and str(m["params"].get("message", "")).startswith("measuring"))
        answer = until(lambda m: m.get("id") == request_id)
        return dict(answer["result"]["structuredContent"])

    watchdog = threading.Timer(240, proc.kill)
    watchdog.start()
    try:
        send({"id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "leaving", "version": "1"}}})
        until(lambda m: m.get("id") == 0)
        send({"method": "notifications/initialized"})
        compiled = call(1, "compile_kernel", {"task_id": "relu", "source": SLOW_RELU, "flags": ["-O2"]})
        assert call(2, "run_tests", {"kernel_id": compiled["kernel_id"]})["passed"]
        call(3, "profile_kernel", {"kernel_id": compiled["kernel_id"], "time_reference": False}, token="p")
        time.sleep(0.5)
        proc.stdin.close()  # the client is gone
        proc.wait(timeout=60)
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait()

    async def next_profile() -> dict[str, Any]:
        async with http_client(home, "next") as client:
            kernel = await passing_kernel(client)
            result = await client.call_tool("profile_kernel", {"kernel_id": kernel, "time_reference": False})
            assert not result.is_error, result.content
            return {"profile": result.structured_content, "recorded": await speedups(client), "next": kernel}

    try:
        seen = anyio.run(next_profile)
    finally:
        with contextlib.suppress(daemon.DaemonError):
            daemon.stop(home)
    assert seen["profile"]["waited_s"] < FREED_WITHIN_S, seen
    assert seen["recorded"].get(compiled["kernel_id"]) is None, seen
    errlog.close()
    said = (tmp_path / "client.log").read_text().strip().splitlines()  # the client's log: one line, no traceback
    assert len(said) == 1 and "the client went away with 1 call(s) in flight" in said[0], said
