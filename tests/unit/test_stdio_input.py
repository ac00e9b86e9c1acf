import json

from kope_mcp.stdio_input import clean_line


def test_a_lone_surrogate_becomes_the_replacement_character_and_the_rest_is_kept():
    line = '{"jsonrpc": "2.0", "id": 2, "params": {"arguments": {"task_id": "a\\ud800b", "n": 3}}}\n'
    cleaned = json.loads(clean_line(line))
    assert cleaned["params"]["arguments"] == {"task_id": "a\ufffdb", "n": 3}
    assert cleaned["id"] == 2


def test_lines_without_lone_surrogates_pass_unchanged():
    for line in ('{"a": "plain"}\n', '{"a": "\\ud83d\\ude00 a valid pair"}\n', "not json at all\n",
                 '{"a": "\\u00e9"}\n'):
        assert clean_line(line) == line
