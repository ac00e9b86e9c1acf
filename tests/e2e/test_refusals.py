"""Wrong calls, as a model makes them, through the SDK's in-process Client: every answer starts with a stable
code and says what is valid, and nothing is stored for a refused call. The same table runs through a real stdio
`kope serve` and over HTTP in test_refusals_over_the_wire.py."""

from __future__ import annotations

import json

import pytest
from mcp import Client

from kope_mcp.app.server import build_server
from tests.conftest import make_settings
from tests.wrong_calls import WRONG_CALLS, bad_answer, call_ids


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"  # module scope: one event loop, so one connected client serves the whole table


@pytest.fixture(scope="module")
async def client(tmp_path_factory):
    async with Client(build_server(make_settings(tmp_path_factory.mktemp("refusals-home")))) as connected:
        yield connected


async def counts(client: Client) -> dict:
    return json.loads((await client.read_resource("kope://memory/stats")).contents[0].text)["counts"]


@pytest.mark.anyio
@pytest.mark.parametrize("tool, arguments, code, detail", WRONG_CALLS, ids=call_ids())
async def test_a_wrong_call_gets_its_code_first_and_stores_nothing(client, tool, arguments, code, detail):
    before = await counts(client)
    result = await client.call_tool(tool, arguments)
    assert result.is_error
    text = result.content[0].text
    assert bad_answer(text, code, detail) is None, text
    assert await counts(client) == before
