#!/usr/bin/env python3
"""How long until a freshly spawned `kope serve` (stdio) answers the MCP handshake and lists its tools?

    python tools/bench_handshake.py [--repeats 5] [--home DIR]

The embedding model loads in a background thread; this shows that it does not delay the handshake.
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
    home = args.home or tempfile.mkdtemp(prefix="kope-handshake-")
    runs = [anyio.run(once, home) for _ in range(args.repeats)]
    ready, listed = [r[0] for r in runs], [r[1] for r in runs]
    print(f"handshake: median {statistics.median(ready):.2f} s (range {min(ready):.2f}-{max(ready):.2f}); "
          f"tools listed: median {statistics.median(listed):.2f} s; n={len(runs)}; KOPE_HOME={home}")


if __name__ == "__main__":
    main()
