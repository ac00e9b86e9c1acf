"""The optimise_kernel prompt (a client's prompt menu starts the KOPE loop) and one resource per task."""

from __future__ import annotations

import json

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from kope_mcp.app.server import build_server
from tests.conftest import make_settings


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    return build_server(make_settings(tmp_path_factory.mktemp("prompt-home")))


def test_the_prompt_walks_the_experience_driven_loop_for_the_task_and_backend(server):
    async def body():
        async with Client(server) as client:
            (prompt,) = (await client.list_prompts()).prompts
            assert prompt.name == "optimise_kernel"
            assert [(a.name, a.required) for a in prompt.arguments] == [
                ("task_id", True), ("backend", False), ("attempts", False)]
            text = (await client.get_prompt("optimise_kernel", {"task_id": "matmul", "backend": "cuda",
                                                                "attempts": "5"})).messages[0].content.text
            assert "task `matmul`" in text and "backend `cuda`" in text and "at most 5 attempts" in text
            steps = ["get_task", "query_experience", "compile_kernel", "run_tests", "profile_kernel",
                     "record_experience"]
            assert [text.index(s) for s in steps] == sorted(text.index(s) for s in steps)
            with pytest.raises(MCPError, match=r"^unknown_task:"):
                await client.get_prompt("optimise_kernel", {"task_id": "nope"})
            with pytest.raises(MCPError, match=r"^(task_not_on_target|target_unavailable):"):
                await client.get_prompt("optimise_kernel", {"task_id": "conv2d", "backend": "cuda"})
    anyio.run(body)


def test_every_task_is_a_resource_with_what_get_task_returns(server):
    async def body():
        async with Client(server) as client:
            templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
            assert templates == {"kope://tasks/{task_id}", "kope://attempts/{kernel_id}/session"}
            task = json.loads((await client.read_resource("kope://tasks/softmax")).contents[0].text)
            assert task["id"] == "softmax" and task["prototype"].startswith("void kernel(")
            assert {"c", "triton", "cuda"} <= set(task["backends"])
            with pytest.raises(MCPError, match="unknown_task:"):
                await client.read_resource("kope://tasks/nope")
            with pytest.raises(MCPError, match="unknown_kernel:"):
                await client.read_resource("kope://attempts/k-nope/session")
    anyio.run(body)
