import mcp.types as types

from kope_mcp.app.proxy import _cache_tools, _cached_tools, _tools_cache


def test_the_tool_list_is_kept_per_code_version_and_read_back(tmp_path):
    (tmp_path / "daemon").mkdir()
    assert _cached_tools(tmp_path) is None
    tools = types.ListToolsResult(tools=[types.Tool(name="get_task", description="d",
                                                    input_schema={"type": "object", "properties": {}})])
    _cache_tools(tmp_path, tools)
    again = _cached_tools(tmp_path)
    assert again is not None and [t.name for t in again.tools] == ["get_task"]
    _tools_cache(tmp_path).write_text("{not json")
    assert _cached_tools(tmp_path) is None  # a damaged cache is refetched, never trusted


def _answer(text: str, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structured_content={"tasks": [text], "count": 1}, is_error=error)


def test_a_catalogue_answer_is_kept_for_its_exact_circumstances_only(tmp_path, monkeypatch):
    import subprocess
    import sys

    from kope_mcp.app import proxy_catalogue as catalogue

    home = tmp_path / "home"
    (home / "daemon").mkdir(parents=True)
    monkeypatch.setenv("KOPE_HOME", str(home))
    catalogue.keep(home, "list_tasks", {"family": None}, _answer("relu (activation, L1)"))
    catalogue.keep(home, "get_task", {"task_id": "nope"}, _answer("unknown_task: nope", error=True))
    catalogue.keep(home, "profile_kernel", {"kernel_id": "k-1"}, _answer("3.2x"))
    kept = catalogue.cached(home, "list_tasks", {})  # None-valued arguments are the same call
    assert kept is not None and kept.content[0].text == "relu (activation, L1)"
    assert catalogue.cached(home, "list_tasks", {"family": "gemm"}) is None
    assert catalogue.cached(home, "get_task", {"task_id": "nope"}) is None  # errors are never kept
    assert catalogue.cached(home, "profile_kernel", {"kernel_id": "k-1"}) is None  # only the catalogue
    # The same circumstances in another process (another hash seed) give the same key.
    code = ("from pathlib import Path; from kope_mcp.app import proxy_catalogue as c; "
            f"print(c.circumstances(Path({str(home)!r})))")
    keys = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            for _ in range(2)}
    assert keys == {catalogue.circumstances(home) + "\n"}
    # A task added to the home, or another setting: the kept answer is not theirs.
    (home / "tasks" / "my_op").mkdir(parents=True)
    (home / "tasks" / "my_op" / "task.toml").write_text('id = "my_op"\n')
    assert catalogue.cached(home, "list_tasks", {}) is None
    catalogue.keep(home, "list_tasks", {}, _answer("with my_op"))
    monkeypatch.setenv("KOPE_PROFILE_S", "9")
    assert catalogue.cached(home, "list_tasks", {}) is None


def test_the_first_catalogue_call_with_no_daemon_is_answered_from_the_kept_answer_without_waiting(tmp_path,
                                                                                                 monkeypatch):
    import anyio

    from kope_mcp.app import proxy
    from kope_mcp.app import proxy_catalogue as catalogue
    from kope_mcp.app.proxy import HomeProxy

    starts: list[object] = []
    monkeypatch.setattr(proxy, "start_owner", starts.append)

    home = tmp_path / "home"
    (home / "daemon").mkdir(parents=True)
    monkeypatch.setenv("KOPE_HOME", str(home))
    catalogue.keep(home, "list_tasks", {}, _answer("kept from the last daemon"))
    from types import SimpleNamespace

    ctx = SimpleNamespace(meta={}, session=None)
    proxy = HomeProxy(home)  # its link is not running: a call that reached for the daemon would never return

    async def first() -> types.CallToolResult:
        with anyio.fail_after(10):
            return await proxy.call_tool(ctx, types.CallToolRequestParams(name="list_tasks", arguments={}))

    result = anyio.run(first)
    assert result.content[0].text == "kept from the last daemon"
    assert starts == [home]  # a daemon is started for the next call meanwhile; this one did not wait for it
