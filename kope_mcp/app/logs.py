"""Where the server's log lines go: stderr always (stdout is the protocol's in stdio mode)."""

from __future__ import annotations

import logging
import sys

# Libraries that log every request at INFO (the stdio proxy's HTTP client wrote ~7 lines per tool call to the
# client's log): quiet unless DEBUG is asked for.
CHATTY = ("httpx", "httpx2", "httpcore", "mcp.client", "mcp.server.streamable_http_manager",
          "mcp.server.lowlevel.server", "mcp.server.mcpserver.server")


def configure_logging(level: str = "INFO") -> None:
    # stdout belongs to the MCP protocol in stdio mode: every log line goes to stderr.
    logging.basicConfig(stream=sys.stderr, level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if level != "DEBUG":
        for name in CHATTY:
            logging.getLogger(name).setLevel(logging.WARNING)
