"""Wrong calls, as a model makes them, through the SDK's in-process Client: every answer starts with a stable
code and says what is valid, and nothing is stored for a refused call. The same table runs through a real stdio
`kope serve` and over HTTP in test_refusals_over_the_wire.py."""

from __future__ import annotations

import json

import anyio
import pytest
from mcp import Client

from kope_mcp.server import build_server
from tests.conftest import make_settings
from tests.wrong_calls import WRONG_CALLS, bad_answer, call_ids


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    return build_server(make_settings(tmp_path_factory.mktemp("refusals-home")))


@pytest.mark.parametrize("tool, arguments, code, detail", WRONG_CALLS, ids=call_ids())
def test_a_wrong_call_gets_its_code_first_and_stores_nothing(server, tool, arguments, code, detail):
    async def body():
        async with Client(server) as client:
            before = json.loads((await client.read_resource("kope://memory/stats")).contents[0].text)["counts"]
            result = await client.call_tool(tool, arguments)
            assert result.is_error
            text = result.content[0].text
            assert bad_answer(text, code, detail) is None, text
            after = json.loads((await client.read_resource("kope://memory/stats")).contents[0].text)["counts"]
            assert after == before
    anyio.run(body)
