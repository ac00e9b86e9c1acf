#!/usr/bin/env python3
"""How long until a freshly spawned `kope serve` (stdio) answers the MCP handshake, lists its tools, and answers
its first tool call (`list_tasks`), against a bare SDK server spawned the same way?

    python tools/bench_handshake.py [--repeats 5] [--home DIR]

Three figures, interleaved so load drifts hit all alike (the load average is printed): *warm* (the home's daemon
already runs: what every client after the first sees), *cold* (the daemon is stopped before each spawn, so the
first tool call waits for `kope serve` to start one: the first client after 10 idle minutes) and *bare* (a
minimal server of the official SDK with one `list_tasks` tool answering a fixed text: the floor any Python MCP
server pays for its interpreter and the SDK). The issue's goal: the first call at most 1.5x bare, cold and warm.
The embedding model loads in a background thread of the daemon and delays none of them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

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


async def once(home: str, bare: bool = False) -> tuple[float, float, float]:
    args = ["-c", BARE] if bare else ["-m", "kope_mcp", "serve", "--log-level", "ERROR"]
    params = StdioServerParameters(command=sys.executable, args=args, env={**os.environ, "KOPE_HOME": home})
    start = time.perf_counter()
    async with Client(params) as client:
        ready = time.perf_counter() - start
        await client.list_tools()
        listed = time.perf_counter() - start
        result = await client.call_tool("list_tasks", {})
        assert not result.is_error, result.content
        called = time.perf_counter() - start
    return ready, listed, called


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--home", help="KOPE_HOME (default: a fresh temporary one)")
    args = parser.parse_args()
    from pathlib import Path

    from kope_mcp.app import daemon

    home = args.home or tempfile.mkdtemp(prefix="kope-handshake-")
    anyio.run(once, home)  # the first run installs nothing, but warms the page cache for every figure
    anyio.run(once, home, True)
    runs: dict[str, list[tuple[float, float, float]]] = {"bare": [], "cold": [], "warm": []}
    loads = []
    for _ in range(args.repeats):
        for mode in ("bare", "cold", "warm"):
            if mode == "cold":
                daemon.stop(Path(home))
            runs[mode].append(anyio.run(once, home, mode == "bare"))
            loads.append(os.getloadavg()[0])
    daemon.stop(Path(home))
    floor = statistics.median(r[2] for r in runs["bare"])
    for mode, results in runs.items():
        ready, listed, called = ([r[i] for r in results] for i in range(3))
        first = statistics.median(called)
        print(f"{mode}: handshake median {statistics.median(ready):.2f} s; tools listed {statistics.median(listed):.2f}"
              f" s; first list_tasks answered {first:.2f} s (range {min(called):.2f}-{max(called):.2f}, "
              f"{first / floor:.2f}x bare); n={len(results)}")
    print(f"load average {min(loads):.2f}-{max(loads):.2f}; KOPE_HOME={home}")


if __name__ == "__main__":
    main()
