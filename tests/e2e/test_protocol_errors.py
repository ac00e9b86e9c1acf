"""Protocol-level refusals carry the standard JSON-RPC codes and one line that says what is valid: prompts/get, an
unknown resource, a cursor this server never handed out (in process, and through a real stdio `kope serve` and the
daemon's HTTP transport), and, over HTTP, a body that is not one JSON-RPC message."""

from __future__ import annotations

import contextlib
import json

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, Implementation

from kope_mcp.app import daemon
from kope_mcp.app.server import build_server
from tests.conftest import make_settings
from tests.transports import http_client, stdio

# (what is asked, the message's start, a detail it must name)
PROTOCOL_REFUSALS = [
    (("prompt", "nope", {}), "unknown_prompt:", "optimise_kernel"),
    (("prompt", "optimise_kernel", {}), "invalid_argument:", "`task_id` is required"),
    (("prompt", "optimise_kernel", {"task_id": "softmax", "budget": "3"}), "invalid_argument:",
     "`budget` is not an argument"),
    (("prompt", "optimise_kernel", {"task_id": "softmax", "attempts": "many"}), "invalid_argument:",
     "from 1 to 100"),
    (("prompt", "optimise_kernel", {"task_id": "nope"}), "unknown_task:", "softmax"),
    (("resource", "kope://tasks/nope", None), "unknown_task:", "softmax"),
    (("resource", "kope://nope", None), "unknown_resource:", "kope://tasks/{task_id}"),
    (("list", "tools", "abc"), "invalid_cursor:", "without one"),
    (("list", "resources", "abc"), "invalid_cursor:", "resources/list"),
    (("list", "templates", "abc"), "invalid_cursor:", "resources/templates/list"),
    (("list", "prompts", "abc"), "invalid_cursor:", "prompts/list"),
]


async def ask(client: Client, what: tuple) -> object:
    kind, name, extra = what
    if kind == "prompt":
        return await client.get_prompt(name, extra)
    if kind == "resource":
        return await client.read_resource(name)
    lists = {"tools": client.list_tools, "resources": client.list_resources,
             "templates": client.list_resource_templates, "prompts": client.list_prompts}
    return await lists[name](cursor=extra)


async def refusals(client: Client) -> list[str]:
    failures = []
    for what, start, detail in PROTOCOL_REFUSALS:
        try:
            answer = await ask(client, what)
        except MCPError as exc:
            error = exc.error
            if error.code != INVALID_PARAMS or not error.message.startswith(start) or detail not in error.message:
                failures.append(f"{what}: {error.code} {error.message[:160]}")
            continue
        failures.append(f"{what}: answered {str(answer)[:120]}")
    # and what is valid still answers
    assert [p.name for p in (await client.list_prompts()).prompts] == ["optimise_kernel"]
    assert (await client.list_tools()).tools
    return failures


def test_every_protocol_refusal_is_invalid_params_with_its_code_in_process(tmp_path):
    server = build_server(make_settings(tmp_path / "home"))

    async def body() -> list[str]:
        with anyio.fail_after(60):
            async with Client(server) as client:
                return await refusals(client)

    assert anyio.run(body) == []


@pytest.mark.slow  # subprocess servers
@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_every_protocol_refusal_is_invalid_params_over_a_real_transport(tmp_path, transport):
    home = tmp_path / "home"

    async def body() -> list[str]:
        with anyio.fail_after(180):
            client = (Client(stdio(home), client_info=Implementation(name="protocol", version="1"))
                      if transport == "stdio" else http_client(home, "protocol"))
            async with client:
                return await refusals(client)

    try:
        assert anyio.run(body) == []
    finally:
        with contextlib.suppress(daemon.DaemonError):
            daemon.stop(home)


@pytest.mark.slow  # a subprocess daemon
def test_an_http_body_that_is_not_one_jsonrpc_message_is_invalid_request(tmp_path):
    import httpx2 as httpx

    home = tmp_path / "home"
    state = daemon.ensure(home)
    headers = {"Authorization": f"Bearer {state.token}", "Content-Type": "application/json",
               "Accept": "application/json, text/event-stream"}
    try:
        with httpx.Client(timeout=30) as web:
            for body, says in [([{"jsonrpc": "2.0", "id": 1, "method": "ping"}], "batches"),
                               ({"id": 2, "method": "tools/list"}, '"jsonrpc": "2.0"')]:
                answer = web.post(state.url + "/mcp", content=json.dumps(body), headers=headers)
                error = answer.json()["error"]
                assert answer.status_code == 400 and error["code"] == -32600, answer.text
                assert error["message"].startswith("invalid_request:") and says in error["message"]
            answer = web.post(state.url + "/mcp", content="{nope", headers=headers)
            assert answer.json()["error"]["code"] == -32700
    finally:
        with contextlib.suppress(daemon.DaemonError):
            daemon.stop(home)


def test_a_list_sent_as_a_json_string_is_still_read_as_the_sdk_reads_it(tmp_path):
    # Claude Desktop sends lists as JSON text: strict checking must come after the SDK's reading of them.
    from tests.conftest import VECTOR_ADD_OK

    server = build_server(make_settings(tmp_path / "home"))

    async def body() -> list[object]:
        async with Client(server) as client:
            answers = []
            for flags in ('["-O2"]', ["-O2"]):
                result = await client.call_tool("compile_kernel", {"task_id": "vector_add", "source": VECTOR_ADD_OK,
                                                                   "flags": flags})
                assert not result.is_error, result.content
                answers.append(result.structured_content["ok"])
            return answers

    assert anyio.run(body) == [True, True]
