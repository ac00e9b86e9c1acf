"""Clients of a real `kope serve`: a stdio subprocess (through the home's daemon) and an HTTP client of the daemon."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.types import Implementation

from kope_mcp.app import daemon


def stdio(home: Path) -> StdioServerParameters:
    env = {**os.environ, "KOPE_HOME": str(home), "KOPE_EMBEDDINGS": "off", "KOPE_PROFILE_S": "0.3"}
    return StdioServerParameters(command=sys.executable, args=["-m", "kope_mcp", "serve", "--log-level", "WARNING"],
                                 env=env)


def http_client(home: Path, name: str) -> Client:
    # The stdio clients' proxies start the home's daemon in the background: wait for it (or start it) here.
    state = daemon.ensure(home)
    assert state.token
    transport = streamable_http_client(state.url + "/mcp", http_client=create_mcp_http_client(
        headers={"Authorization": f"Bearer {state.token}"}))
    return Client(transport, client_info=Implementation(name=name, version="1"))
