#!/usr/bin/env python3
"""How long until a freshly spawned `kope serve` (stdio) answers the MCP handshake, lists its tools, and answers
its first tool call, against a bare SDK server spawned the same way?

    python tools/bench_handshake.py [--repeats 5] [--home DIR] [--think 2]

Five figures, interleaved so load drifts hit all alike (the load average is printed): *warm* (the home's daemon
already runs: what every client after the first sees), *cold* (the daemon is stopped before each spawn: the first
client after 10 idle minutes, on a home used before), *new* and *new-query* (a new home each time, no daemon: a
newcomer's first `list_tasks`, or first `query_experience`), and *bare* (a minimal server of the official SDK
with one `list_tasks` tool answering a fixed text: the floor any Python MCP server pays for its interpreter and
the SDK). The first call is `list_tasks` but in new-query. The goal: the first call at most 1.5x bare. After a
new-home run the daemon its proxy started is waited for and stopped, and before each run the home's daemon is
waited for until it computes nothing (its model loads for seconds), so that neither is the next figure's noisy
neighbour. *new-think* is what a client driven by a model sees: its first `query_experience` on a new home is made
a few seconds after the tool list (the model's turn), and only the call itself is timed.

Run it where users run it: with bytecode caches (PYTHONDONTWRITEBYTECODE unset; an installed package has them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

BARE = """
from mcp.server import MCPServer
server = MCPServer("bare")

@server.tool()
def list_tasks() -> str:
    \"\"\"A fixed answer.\"\"\"
    return "vector_add, matmul"

server.run()
"""


QUERY = {"query": "make vector_add faster", "task_id": "vector_add"}


async def once(home: str, bare: bool = False, query: bool = False, think_s: float = 0.0) -> tuple[float, float, float]:
    args = ["-c", BARE] if bare else ["-m", "kope_mcp", "serve", "--log-level", "ERROR"]
    params = StdioServerParameters(command=sys.executable, args=args, env={**os.environ, "KOPE_HOME": home})
    start = time.perf_counter()
    async with Client(params) as client:
        ready = time.perf_counter() - start
        await client.list_tools()
        listed = time.perf_counter() - start
        await anyio.sleep(think_s)  # a model deciding what to call: seconds, in a real client
        asked = time.perf_counter()
        result = await (client.call_tool("query_experience", QUERY) if query else client.call_tool("list_tasks", {}))
        assert not result.is_error, result.content
        called = time.perf_counter() - start if not think_s else time.perf_counter() - asked
    return ready, listed, called


def quiet(home: Path, limit_s: float = 60.0) -> None:
    """Wait until the home's daemon, if one runs, has stopped computing (its embedding model loads for seconds
    after it starts: beside a figure, it is the noisy neighbour)."""
    from kope_mcp.app import daemon

    state = daemon.running(home)
    if state is None:
        return
    ticks = os.sysconf("SC_CLK_TCK")

    def cpu() -> float:
        try:
            fields = Path(f"/proc/{state.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / ticks
        except (OSError, IndexError, ValueError):
            return 0.0

    deadline = time.monotonic() + limit_s
    before = cpu()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = cpu()
        if now - before < 0.05:
            return
        before = now


def settle(home: Path) -> None:
    """Wait for the daemon a new home's proxy started (it outlives the proxy, for the next client), and stop it."""
    from kope_mcp.app import daemon

    start = time.monotonic()
    while time.monotonic() < start + 60:
        state = daemon.running(home)
        if state is not None and state.url and daemon.accepting(state.url):
            break
        if state is None and time.monotonic() > start + 5:
            break  # none was spawned (the proxy ended before its starter thread did)
        time.sleep(0.2)
    daemon.stop(home)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--home", help="KOPE_HOME (default: a fresh temporary one)")
    parser.add_argument("--think", type=float, default=2.0,
                        help="seconds between the tool list and the first call in new-think (a model's turn)")
    args = parser.parse_args()
    from kope_mcp.app import daemon

    home = args.home or tempfile.mkdtemp(prefix="kope-handshake-")
    anyio.run(once, home)  # the first run installs nothing, but warms the page cache for every figure
    anyio.run(once, home, True)
    modes = ("bare", "cold", "warm", "new", "new-query", "new-think")
    runs: dict[str, list[tuple[float, float, float]]] = {m: [] for m in modes}
    loads = []
    for _ in range(args.repeats):
        for mode in runs:
            if mode == "cold":
                daemon.stop(Path(home))
            quiet(Path(home))
            where = tempfile.mkdtemp(prefix="kope-handshake-new-") if mode.startswith("new") else home
            think = args.think if mode == "new-think" else 0.0
            runs[mode].append(anyio.run(once, where, mode == "bare", mode.startswith("new-"), think))
            loads.append(os.getloadavg()[0])
            if where != home:
                settle(Path(where))
    daemon.stop(Path(home))
    floor = statistics.median(r[2] for r in runs["bare"])
    think = runs.pop("new-think")
    for mode, results in runs.items():
        ready, listed, called = ([r[i] for r in results] for i in range(3))
        first = statistics.median(called)
        print(f"{mode}: handshake median {statistics.median(ready):.2f} s; tools listed {statistics.median(listed):.2f}"
              f" s; first call answered {first:.2f} s (range {min(called):.2f}-{max(called):.2f}, "
              f"{first / floor:.2f}x bare); n={len(results)}")
    took = [r[2] * 1000 for r in think]
    print(f"new-think: query_experience made {args.think:g} s after the tool list answered in "
          f"{statistics.median(took):.0f} ms (range {min(took):.0f}-{max(took):.0f}); n={len(took)}")
    print(f"load average {min(loads):.2f}-{max(loads):.2f}; KOPE_HOME={home}")


if __name__ == "__main__":
    main()
