"""The bench's bounded reader: a transcript keeps the most recent W tokens, as a chat client does."""

from __future__ import annotations

from kope_mcp.bench.transcript import MESSAGE_OVERHEAD, Transcript
from kope_mcp.experience.tokens import count_tokens


def read(items: list[tuple[str, str]]) -> tuple[str, list[dict]]:
    """A context of one line per (id, text), with spans, as query_experience returns it."""
    text, out = "# memory", []
    for item_id, line in items:
        text += "\n"
        out.append({"id": item_id, "span": (len(text), len(text) + len(line)), "strategy": line})
        text += line
    return text, out


def test_an_unbounded_transcript_keeps_everything():
    t = Transcript(None)
    for i in range(50):
        t.add("user", *read([(f"x-{i}", f"- lesson {i} " * 50)])[:1])
    assert len(t.messages) == 50 and t.dropped_tokens == 0


def test_the_oldest_messages_go_first_and_pinned_ones_stay():
    t = Transcript(300)
    t.add("system", "you optimise kernels", pinned=True)
    for i in range(10):
        text, items = read([(f"x-{i}", f"- strategy {i} worked " * 8)])
        t.add("user", text, items=items)
    assert t.tokens <= 300 and t.messages[0].role == "system"
    ids = [i["id"] for i in t.visible_items()]
    assert ids == [f"x-{i}" for i in range(10 - len(ids), 10)] and 0 < len(ids) < 10
    assert t.dropped_tokens > 0


def test_a_read_longer_than_the_window_keeps_only_its_most_recent_items():
    t = Transcript(200)
    text, items = read([(f"x-{i}", f"- [effective] task {i}: strategy {i}") for i in range(100)])
    t.add("user", text, items=items)
    kept = t.visible_items()
    assert t.tokens <= 200 and 0 < len(kept) < 100
    assert [i["id"] for i in kept] == [f"x-{i}" for i in range(100 - len(kept), 100)]
    message = t.messages[-1]
    for item in kept:  # spans still point at the item's text in what was kept
        assert message.text[slice(*item["span"])] == item["strategy"]
    assert message.tokens == count_tokens(message.text) + MESSAGE_OVERHEAD


def test_a_tool_call_and_its_result_are_dropped_together():
    t = Transcript(120)
    t.add("system", "sys", pinned=True)
    t.add("assistant", "", wire={"tool_calls": [{"id": "c1"}]})
    t.add("tool", "result " * 40, wire={"tool_call_id": "c1"})
    t.add("user", "next " * 40)
    roles = [m["role"] for m in t.wire_messages()]
    assert roles[0] == "system" and roles[1:2] != ["tool"]  # never a result without its call
    assert "assistant" not in roles or roles.index("tool") == roles.index("assistant") + 1
