import json

import mcp.types as types

from kope_mcp.app.stdio_input import clean_line, malformed_answer


def test_a_lone_surrogate_becomes_the_replacement_character_and_the_rest_is_kept():
    line = '{"jsonrpc": "2.0", "id": 2, "params": {"arguments": {"task_id": "a\\ud800b", "n": 3}}}\n'
    cleaned = json.loads(clean_line(line))
    assert cleaned["params"]["arguments"] == {"task_id": "a\ufffdb", "n": 3}
    assert cleaned["id"] == 2


def test_lines_without_lone_surrogates_pass_unchanged():
    for line in ('{"a": "plain"}\n', '{"a": "\\ud83d\\ude00 a valid pair"}\n', "not json at all\n",
                 '{"a": "\\u00e9"}\n'):
        assert clean_line(line) == line


def test_a_line_that_is_not_json_is_answered_with_a_parse_error_and_no_id():
    line = '{"jsonrpc": "2.0", "id": 1, "method": "tools/li'
    answer = json.loads(malformed_answer(line, types.jsonrpc_message_adapter))
    assert answer["id"] is None and answer["error"]["code"] == -32700
    assert "one JSON-RPC 2.0 message per line" in answer["error"]["message"]


def test_json_that_is_no_json_rpc_message_is_an_invalid_request_answered_with_its_id():
    for line, request_id in (('{"jsonrpc": "2.0", "id": 9, "method": 17}', 9), ('[1, 2]', None),
                             ('{"id": "a", "method": "ping"}', "a"), ('{"jsonrpc": "2.0", "id": true}', None)):
        answer = json.loads(malformed_answer(line, types.jsonrpc_message_adapter))
        assert answer["error"]["code"] == -32600, line
        assert answer["id"] == request_id, line
        assert "pydantic" not in answer["error"]["message"]


def test_well_formed_requests_notifications_and_responses_pass():
    for line in ('{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}',
                 '{"jsonrpc": "2.0", "method": "notifications/initialized"}',
                 '{"jsonrpc": "2.0", "id": 4, "result": {}}'):
        assert malformed_answer(line, types.jsonrpc_message_adapter) is None
