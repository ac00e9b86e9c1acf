"""The table of wrong calls through a real stdio `kope serve` (its proxy and the home's daemon) and through the
daemon's HTTP transport, as clients other than the SDK's in-process one meet them: each answer starts with its code,
and the memory is unchanged afterwards."""

from __future__ import annotations

import contextlib
import json

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.types import Implementation

from kope_mcp.app import daemon
from tests.transports import http_client, stdio
from tests.wrong_calls import WRONG_CALLS, bad_answer

pytestmark = pytest.mark.slow  # subprocess servers


async def answer_text(client: Client, tool: str, arguments: dict) -> str:
    try:
        result = await client.call_tool(tool, arguments)
    except MCPError as exc:  # a direct HTTP client meets the transport's body limit as a JSON-RPC error
        return exc.error.message
    if not result.is_error:
        return f"(not an error: {str(result.structured_content)[:120]})"
    return result.content[0].text


async def counts(client: Client) -> dict:
    return json.loads((await client.read_resource("kope://memory/stats")).contents[0].text)["counts"]


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_every_wrong_call_over_a_real_transport_gets_its_code_and_stores_nothing(tmp_path, transport):
    home = tmp_path / "home"

    async def body() -> list[str]:
        failures = []
        with anyio.fail_after(300):
            client = (Client(stdio(home), client_info=Implementation(name="table", version="1"))
                      if transport == "stdio" else http_client(home, "table"))
            async with client:
                before = await counts(client)
                for i, (tool, arguments, code, detail) in enumerate(WRONG_CALLS):
                    text = await answer_text(client, tool, arguments)
                    why = bad_answer(text, code, detail)
                    if why is not None:
                        failures.append(f"#{i} {tool} {sorted(arguments)}: {why}: {text[:200]}")
                assert await counts(client) == before
        return failures

    try:
        failures = anyio.run(body)
    finally:
        with contextlib.suppress(daemon.DaemonError):
            daemon.stop(home)
    assert not failures, "\n".join(failures)
