#!/usr/bin/env python3
"""How long until a freshly spawned `kope serve` (stdio) answers the MCP handshake and lists its tools?

    python tools/bench_handshake.py [--repeats 5] [--home DIR]

Two figures, side by side: *warm* (the home's daemon already runs: what every client after the first sees) and
*cold* (the daemon is stopped before each spawn, so `kope serve` starts one: the first client after 10 idle
minutes). Interleaved, so load drifts hit both alike; the load average is printed. The embedding model loads in a
background thread of the daemon and does not delay either.
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


async def once(home: str) -> tuple[float, float]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "kope_mcp", "serve", "--log-level", "ERROR"],
                                   env={**os.environ, "KOPE_HOME": home})
    start = time.perf_counter()
    async with Client(params) as client:
        ready = time.perf_counter() - start
        await client.list_tools()
        listed = time.perf_counter() - start
    return ready, listed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--home", help="KOPE_HOME (default: a fresh temporary one)")
    args = parser.parse_args()
    from pathlib import Path

    from kope_mcp import daemon

    home = args.home or tempfile.mkdtemp(prefix="kope-handshake-")
    anyio.run(once, home)  # the first run installs nothing, but warms the page cache for both figures
    runs: dict[str, list[tuple[float, float]]] = {"warm": [], "cold": []}
    for _ in range(args.repeats):
        for mode in ("cold", "warm"):
            if mode == "cold":
                daemon.stop(Path(home))
            runs[mode].append(anyio.run(once, home))
    daemon.stop(Path(home))
    for mode, results in runs.items():
        ready, listed = [r[0] for r in results], [r[1] for r in results]
        print(f"{mode}: handshake median {statistics.median(ready):.2f} s (range {min(ready):.2f}-{max(ready):.2f}); "
              f"tools listed median {statistics.median(listed):.2f} s; n={len(results)}")
    print(f"load average {os.getloadavg()[0]:.2f}; KOPE_HOME={home}")


if __name__ == "__main__":
    main()
