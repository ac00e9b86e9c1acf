"""The stdio proxy's own answers while a home's daemon starts (app/proxy_early.py): each the daemon's answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import Client

from kope_mcp.app import proxy_early
from kope_mcp.app.proxy_early import EarlyAnswers, shipped_text, shipped_tools
from kope_mcp.app.server import build_server

# Calls a newcomer's first minutes are made of, and a few that stretch the selection (an error pasted into the
# question, a backend, a tiny budget, a long question).
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("list_tasks", {}),
    ("list_tasks", {"family": "reduction"}),
    ("list_tasks", {"level": 2, "family": None}),
    ("get_task", {"task_id": "matmul"}),
    ("get_task", {"task_id": "vector_add"}),
    ("query_experience", {"query": "make vector_add faster", "task_id": "vector_add"}),
    ("query_experience", {"query": "how do I block a matmul?"}),
    ("query_experience", {"query": "kernel.c:3:5: error: 'x' undeclared (first use in this function)",
                          "task_id": "relu", "token_budget": 40}),
    ("query_experience", {"query": "vectorise", "task_id": "softmax", "backend": "c", "phase": "optimize",
                          "agent": "claude", "agent_mode": "only", "hardware": "x86_64/some/2c"}),
    ("query_experience", {"query": "long " * 1000, "task_id": "saxpy"}),
]


@pytest.fixture
def new_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("KOPE_HOME", str(home))
    monkeypatch.setenv("KOPE_EMBEDDINGS", "off")
    monkeypatch.delenv("KOPE_CLUSTER", raising=False)
    return home


def test_the_shipped_tool_list_is_the_servers_own(new_home: Path) -> None:
    async def listed() -> types.ListToolsResult:
        async with Client(build_server()) as client:
            return await client.list_tools()

    current = anyio.run(listed)
    assert proxy_early.SHIPPED_TOOLS.read_text(encoding="utf-8") == shipped_text(current), \
        "the shipped tool list is stale: run `python tools/write_tool_list.py`"
    shipped = shipped_tools()
    assert shipped is not None and shipped == types.ListToolsResult.model_validate(
        current.model_dump(mode="json", by_alias=True, exclude_none=True))


def test_a_shipped_tool_list_written_from_other_code_is_not_used(new_home: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    other = tmp_path / "tool_list.json"
    data = json.loads(proxy_early.SHIPPED_TOOLS.read_text(encoding="utf-8"))
    other.write_text(json.dumps({**data, "key": "0" * 16}))
    monkeypatch.setattr(proxy_early, "SHIPPED_TOOLS", other)
    assert shipped_tools() is None
    other.write_text("{not json")
    assert shipped_tools() is None


def test_each_early_answer_is_the_one_the_server_gives_on_a_new_home(new_home: Path) -> None:
    early = EarlyAnswers(new_home)  # before the server makes the home's memory, as the proxy does

    async def server_answers() -> list[types.CallToolResult]:
        async with Client(build_server()) as client:
            return [await client.call_tool(name, arguments) for name, arguments in CALLS]

    served = anyio.run(server_answers)
    for (name, arguments), theirs in zip(CALLS, served, strict=True):
        mine = early.answer(name, arguments)
        assert mine is not None, (name, arguments)
        assert not theirs.is_error, theirs.content
        assert mine.structured_content == theirs.structured_content, (name, arguments)
        assert [c.model_dump() for c in mine.content] == [c.model_dump() for c in theirs.content], (name, arguments)


@pytest.mark.parametrize(("name", "arguments"), [
    ("get_task", {"task_id": "no_such_task"}),  # the refusal is the daemon's to word
    ("get_task", {}),
    ("list_tasks", {"family": "no_such_family"}),
    ("list_tasks", {"level": "2"}),  # a wrong type: the daemon refuses it, strictly
    ("list_tasks", {"level": True}),
    ("list_tasks", {"level": 7}),
    ("list_tasks", {"surprise": 1}),
    ("query_experience", {"task_id": "relu"}),  # no question
    ("query_experience", {"query": "q", "session_id": "s-1"}),  # a session lives in the memory
    ("query_experience", {"query": "q", "backend": "fortran"}),
    ("query_experience", {"query": "q", "phase": "later"}),
    ("query_experience", {"query": "q", "token_budget": 0}),
    ("compile_kernel", {"task_id": "relu", "source": "int x;"}),
    ("record_experience", {"strategy": "s", "lesson": "l"}),
])
def test_what_only_the_daemon_can_answer_is_left_to_it(new_home: Path, name: str, arguments: dict[str, Any]) -> None:
    assert EarlyAnswers(new_home).answer(name, arguments) is None


def test_a_home_with_a_memory_or_a_cluster_gets_no_early_selection(new_home: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    question = {"query": "make it faster", "task_id": "relu"}
    new_home.mkdir()
    from kope_mcp.settings import KopeSettings

    KopeSettings.from_env().memory_path.write_bytes(b"")  # a memory, of whatever size: the daemon selects
    used = EarlyAnswers(new_home)
    assert used.answer("query_experience", question) is None
    assert used.answer("list_tasks", {}) is not None  # the catalogue reads no memory
    fresh = EarlyAnswers(new_home / "fresh")
    monkeypatch.setattr(proxy_early, "NEW_HOME_WINDOW_S", 0.0)
    assert EarlyAnswers(new_home / "later").answer("query_experience", question) is None  # the window passed
    assert fresh.answer("query_experience", question) is not None
    monkeypatch.setenv("KOPE_CLUSTER", "127.0.0.1:6379")
    assert fresh.answer("list_tasks", {}) is None  # the cluster's devices are the daemon's to list


def test_a_new_homes_first_calls_are_answered_by_the_proxy_while_no_daemon_accepts(
        new_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from kope_mcp.app import proxy
    from kope_mcp.app.proxy import HomeProxy

    starts: list[object] = []
    monkeypatch.setattr(proxy, "start_owner", starts.append)
    home_proxy = HomeProxy(new_home)  # its link is not running: a call that reached for the daemon would hang
    ctx = SimpleNamespace(meta={}, session=None)

    async def first_calls() -> list[Any]:
        with anyio.fail_after(30):
            tools = await home_proxy.list_tools(ctx, None)
            return [tools, *[await home_proxy.call_tool(ctx, types.CallToolRequestParams(name=n, arguments=a))
                             for n, a in CALLS[:1] + CALLS[5:6]]]

    tools, tasks, selected = anyio.run(first_calls)
    assert "profile_kernel" in {t.name for t in tools.tools}
    assert not tasks.is_error and tasks.structured_content["count"] >= 50
    assert selected.structured_content["items"][0]["id"] == "vector_add"
    assert starts == [new_home, new_home]  # each early answer makes sure a daemon is on its way
