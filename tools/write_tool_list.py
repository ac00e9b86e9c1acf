#!/usr/bin/env python3
"""Write kope_mcp/app/tool_list.json: the server's tool list as a client reads it, which the stdio proxy answers
while its home's daemon starts (app/proxy_early.py). Run it after editing a tool, a model or the instructions;
`tests/app/test_proxy_early.py` fails until the shipped list is the server's own.

    python tools/write_tool_list.py [--check]
"""

from __future__ import annotations

import argparse
import sys

import anyio
from mcp import Client

from kope_mcp.app.proxy_early import SHIPPED_TOOLS, shipped_text
from kope_mcp.app.server import build_server


async def current_text() -> str:
    async with Client(build_server()) as client:
        return shipped_text(await client.list_tools())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only say whether the shipped list is current")
    args = parser.parse_args()
    text = anyio.run(current_text)
    old = SHIPPED_TOOLS.read_text(encoding="utf-8") if SHIPPED_TOOLS.exists() else ""
    if args.check:
        print("current" if old == text else f"stale: run {sys.argv[0]}")
        return 0 if old == text else 1
    SHIPPED_TOOLS.write_text(text, encoding="utf-8")
    print(f"wrote {SHIPPED_TOOLS} ({len(text):,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
