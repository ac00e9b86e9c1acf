"""The whole loop through the official SDK's in-process Client, as an MCP client sees it."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from mcp import Client

from kope_mcp.app.server import build_server
from kope_mcp.experience.tokens import count_tokens
from kope_mcp.tasks.registry import TaskRegistry
from tests.conftest import VECTOR_ADD_OK, make_settings

TASK_IDS = sorted(t.id for t in TaskRegistry.default().list())
# The everyday loop runs the whole workflow on one task per shape of problem; every task runs with -m slow.
# relu for the elementwise loop: vector_add's 16M-element profile alone takes 6-10 s here (full run only).
EVERYDAY_TASKS = {"relu", "softmax", "matmul"}
LOOP_TASKS = [pytest.param(t, marks=() if t in EVERYDAY_TASKS else pytest.mark.slow) for t in TASK_IDS]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    return build_server(make_settings(tmp_path_factory.mktemp("mcp-home")))


def run(coro_fn, *args):
    return anyio.run(coro_fn, *args)


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


def test_tools_are_listed_with_schemas_annotations_and_docstrings(server):
    async def body():
        async with Client(server) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert {"list_tasks", "get_task", "compile_kernel", "run_tests", "profile_kernel"} <= set(tools)
            compile_tool = tools["compile_kernel"]
            props = compile_tool.input_schema["properties"]
            assert list(props)[:7] == ["task_id", "source", "backend", "session_id", "parent_id", "strategy", "flags"]
            assert "kernel_id" in compile_tool.output_schema["properties"]
            assert tools["get_task"].annotations.read_only_hint is True
            assert "run_tests" in compile_tool.description
    run(body)


@pytest.mark.parametrize("task_id", LOOP_TASKS)
def test_the_full_loop_works_on_every_task(server, task_id):
    async def body():
        async with Client(server) as client:
            task = await call(client, "get_task", task_id=task_id)
            assert task["prototype"].startswith("void kernel(")
            compiled = await call(client, "compile_kernel", task_id=task_id, source=task["baseline_source"],
                                  flags=["-O3"], strategy="baseline at -O3")
            assert compiled["ok"], compiled["log"]
            tested = await call(client, "run_tests", kernel_id=compiled["kernel_id"])
            assert tested["passed"], tested["message"]
            progress: list[float] = []

            async def on_progress(done: float, total: float | None, message: str | None) -> None:
                progress.append(done)

            result = await client.call_tool("profile_kernel", {"kernel_id": compiled["kernel_id"]},
                                            progress_callback=on_progress)
            profile = result.structured_content
            assert not result.is_error and profile is not None
            assert profile["failure"] is None, profile["message"]
            assert profile["kernel"]["median_s"] > 0 and profile["baseline"]["median_s"] > 0
            assert profile["reference"]["median_s"] > 0
            assert profile["kernel"]["ci95_low_s"] <= profile["kernel"]["median_s"] <= profile["kernel"]["ci95_high_s"]
            assert profile["speedup_vs_baseline"] > 0 and profile["threads"] == 1
            assert profile["hardware"]["cores"] >= 1
            assert progress, "profile_kernel sends progress notifications"
    run(body)


def test_errors_reach_the_model_as_tool_errors_with_codes_and_the_server_keeps_serving(server):
    async def body():
        async with Client(server) as client:
            bad = await client.call_tool("get_task", {"task_id": "nope"})
            assert bad.is_error and "unknown_task:" in bad.content[0].text and "vector_add" in bad.content[0].text
            flag = await client.call_tool("compile_kernel", {"task_id": "vector_add", "source": VECTOR_ADD_OK,
                                                             "flags": ["-o/etc/passwd"]})
            assert flag.is_error and "refused_flag:" in flag.content[0].text
            big = await client.call_tool("compile_kernel", {"task_id": "vector_add",
                                                            "source": "x" * (256 * 1024 + 1)})
            assert big.is_error and "source_too_large:" in big.content[0].text
            kernel = await client.call_tool("run_tests", {"kernel_id": "k-nope"})
            assert kernel.is_error and "unknown_kernel:" in kernel.content[0].text
            family = await client.call_tool("list_tasks", {"family": "fft"})
            assert family.is_error and "unknown_family:" in family.content[0].text
            assert "matmul" in family.content[0].text
            crash = await call(client, "compile_kernel", task_id="vector_add",
                               source="#include <stdint.h>\nvoid kernel(const float *a, const float *b, float *out, "
                                      "int64_t n) { volatile float *p = 0; *p = 1; }\n")
            report = await call(client, "run_tests", kernel_id=crash["kernel_id"])
            assert report["failure"] == "crash"
            listing = await call(client, "list_tasks", family="matmul")
            assert {line.split(" ", 1)[0] for line in listing["tasks"]} >= {"matmul", "gemv"}
    run(body)


def test_a_session_links_attempts_and_reuses_builds(server):
    async def body():
        async with Client(server) as client:
            first = await call(client, "compile_kernel", task_id="vector_add", source=VECTOR_ADD_OK)
            second = await call(client, "compile_kernel", task_id="vector_add", source=VECTOR_ADD_OK,
                                session_id=first["session_id"])
            assert second["session_id"] == first["session_id"]
            assert second["parent_id"] == first["kernel_id"]
            assert second["cached"] and second["kernel_id"] != first["kernel_id"]
    run(body)


def test_the_whole_catalogue_reaches_the_model_in_under_2000_tokens_one_line_per_task(server):
    async def body():
        async with Client(server) as client:
            result = await client.call_tool("list_tasks", {})
            text = "".join(block.text for block in result.content if block.type == "text")
            assert count_tokens(text) < 2000, count_tokens(text)
            lines = result.structured_content["tasks"]
            assert len(lines) == result.structured_content["count"] == len(TASK_IDS) >= 53
            assert all("\n" not in line for line in lines)
            assert "relu (activation, L1): " in "\n".join(lines)
            level_4 = (await client.call_tool("list_tasks", {"level": 4})).structured_content["tasks"]
            assert level_4 and all(", L4): " in line for line in level_4)
    run(body)
