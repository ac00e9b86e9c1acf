"""One real `kope serve` subprocess over stdio: the way Claude Desktop runs it."""

from __future__ import annotations

import json
import os
import sys

import anyio
import pytest
from mcp import Client, StdioServerParameters

from tests.conftest import VECTOR_ADD_OK

pytestmark = pytest.mark.slow  # a subprocess or a multi-second workflow: not the everyday loop


def test_a_stdio_client_can_compile_test_and_survive_a_crashing_kernel(tmp_path):
    env = {**os.environ, "KOPE_HOME": str(tmp_path / "home"), "KOPE_PROFILE_S": "0.3"}
    params = StdioServerParameters(command=sys.executable, args=["-m", "kope_mcp", "serve", "--log-level", "WARNING"],
                                   env=env)

    async def body():
        with anyio.fail_after(120):
            async with Client(params) as client:
                assert client.server_info is not None and client.server_info.name == "kope-mcp"
                crash = await client.call_tool("compile_kernel", {
                    "task_id": "vector_add",
                    "source": VECTOR_ADD_OK.replace("out[i] = a[i] + b[i];", "__builtin_trap();")})
                tested = await client.call_tool("run_tests", {"kernel_id": crash.structured_content["kernel_id"]})
                assert tested.structured_content["failure"] == "crash"
                ok = await client.call_tool("compile_kernel", {"task_id": "vector_add", "source": VECTOR_ADD_OK})
                kernel_id = ok.structured_content["kernel_id"]
                assert (await client.call_tool("run_tests", {"kernel_id": kernel_id})).structured_content["passed"]
                profile = await client.call_tool("profile_kernel", {"kernel_id": kernel_id})
                assert not profile.is_error and profile.structured_content["speedup_vs_baseline"] > 0
                # The proxy forwards what the daemon serves beyond tools: the prompt and the task resources.
                assert [p.name for p in (await client.list_prompts()).prompts] == ["optimise_kernel"]
                prompt = await client.get_prompt("optimise_kernel", {"task_id": "relu"})
                assert "query_experience" in prompt.messages[0].content.text
                templates = (await client.list_resource_templates()).resource_templates
                assert [t.uri_template for t in templates] == ["kope://tasks/{task_id}",
                                                                "kope://attempts/{kernel_id}/session"]
                # ... and the views (MCP Apps): their pages, and the session resource the session view reads.
                views = {str(r.uri): r.mime_type for r in (await client.list_resources()).resources}
                assert views["ui://kope/session.html"] == "text/html;profile=mcp-app"
                assert views["ui://kope/experience.html"] == "text/html;profile=mcp-app"
                session = json.loads((await client.read_resource(f"kope://attempts/{kernel_id}/session"))
                                     .contents[0].text)
                assert session["steps"][-1]["kernel_id"] == kernel_id and session["task_id"] == "vector_add"
                listed = {t.name: t.meta for t in (await client.list_tools()).tools}
                assert listed["profile_kernel"]["ui"]["resourceUri"] == "ui://kope/session.html"
                assert listed["query_experience"]["ui"]["resourceUri"] == "ui://kope/experience.html"
                refused = await client.call_tool("get_task", {"task_id": "nope"})
                assert refused.is_error and refused.content[0].text.startswith("unknown_task:")
                # Past the daemon's HTTP body limit, the answer is the cap, not a bare 413.
                huge = await client.call_tool("compile_kernel", {"task_id": "vector_add",
                                                                 "source": VECTOR_ADD_OK + "//" + "x" * 5_000_000})
                assert huge.is_error and huge.content[0].text.startswith("source_too_large:")

    anyio.run(body)
    assert (tmp_path / "home" / "memory.kuzu").is_file()


def test_ordinary_calls_write_nothing_to_the_clients_log(tmp_path):
    from mcp.client.stdio import stdio_client

    from kope_mcp.app import daemon

    home = tmp_path / "home"
    env = {**os.environ, "KOPE_HOME": str(home), "KOPE_EMBEDDINGS": "off"}
    params = StdioServerParameters(command=sys.executable, args=["-m", "kope_mcp", "serve"], env=env)
    errlog = tmp_path / "stderr.txt"

    async def body():
        with errlog.open("w") as err, anyio.fail_after(120):
            async with Client(stdio_client(params, errlog=err)) as client:
                for _ in range(3):
                    assert not (await client.call_tool("list_tasks", {"family": "matmul"})).is_error

    try:
        anyio.run(body)
    finally:
        daemon.stop(home)
    # The proxy's HTTP client logged ~7 INFO lines per call to the client's log (Claude Desktop's mcp-*.log).
    assert errlog.read_text().strip() == ""


def test_a_stdio_client_outlives_its_homes_daemon_between_calls(tmp_path):
    from kope_mcp.app import daemon

    home = tmp_path / "home"
    env = {**os.environ, "KOPE_HOME": str(home), "KOPE_EMBEDDINGS": "off"}
    params = StdioServerParameters(command=sys.executable, args=["-m", "kope_mcp", "serve"], env=env)

    async def body():
        with anyio.fail_after(180):
            async with Client(params) as client:
                assert not (await client.call_tool("list_tasks", {"family": "matmul"})).is_error
                # The proxy may answer the catalogue itself while the daemon it started comes up: wait for it.
                first = await anyio.to_thread.run_sync(daemon.ensure, home)
                await anyio.to_thread.run_sync(daemon.stop, home)  # the proxy's kept session breaks
                await anyio.sleep(1.5)  # its event stream notices and retries meanwhile
                # Not the catalogue (a kept answer would serve it while a new daemon starts): the memory's stats.
                again = await client.read_resource("kope://memory/stats")
                assert "counts" in again.contents[0].text, again
                assert daemon.running(home).pid != first.pid

    try:
        anyio.run(body)
    finally:
        daemon.stop(home)


def test_a_stdio_server_on_an_unusable_home_answers_every_call_with_one_line_and_logs_one(tmp_path):
    from mcp.client.stdio import stdio_client
    from mcp.shared.exceptions import MCPError

    (tmp_path / "a-file").write_text("not a folder")
    env = {**os.environ, "KOPE_HOME": str(tmp_path / "a-file" / "kope"), "KOPE_EMBEDDINGS": "off"}
    params = StdioServerParameters(command=sys.executable, args=["-m", "kope_mcp", "serve"], env=env)
    errlog = tmp_path / "stderr.txt"

    async def body() -> list[str]:
        said = []
        with errlog.open("w") as err, anyio.fail_after(120):
            async with Client(stdio_client(params, errlog=err)) as client:
                for tool, arguments in (("list_tasks", {}), ("compile_kernel", {"task_id": "vector_add",
                                                                                 "source": VECTOR_ADD_OK})):
                    result = await client.call_tool(tool, arguments)
                    assert result.is_error
                    said.append(result.content[0].text)
                with pytest.raises(MCPError) as refused:
                    await client.read_resource("kope://memory/stats")
                said.append(refused.value.error.message)
        return said

    said = anyio.run(body)
    assert all(text.startswith("home_unusable: KOPE_HOME ") and "a-file is a file" in text for text in said), said
    log = errlog.read_text().strip().splitlines()
    assert len(log) == 1 and "home_unusable:" in log[0], log
