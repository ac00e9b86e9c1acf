import mcp.types as types

from kope_mcp.proxy import _cache_tools, _cached_tools, _tools_cache


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
