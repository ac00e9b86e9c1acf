"""A chat transcript seen through a context window of W tokens: what a bounded model can still read.

Every agent of the bench, scripted or LLM, keeps its conversation here: the task statement, what it read from
the memory, the kernels it wrote and the tools' answers. When the transcript outgrows the window, it loses what
a chat client loses: the oldest messages first (an assistant's tool calls together with their results, so the
wire format stays valid), and a single message longer than the window keeps only its most recent tokens. Pinned
messages (the system prompt, the task) always stay. Tokens are real cl100k_base tokens (experience/tokens.py) plus
a few per message for the chat format's framing.

The scripted agent reads only `visible_items()`: the memory items whose text still lies wholly inside the
window. So a policy that pastes 40k tokens of history into an 8k window acts on its last few thousand tokens,
as a model would, and nothing else in the bench is tuned to the result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kope_mcp.experience.tokens import TokenCounter, token_counter

MESSAGE_OVERHEAD = 4  # role and separators of one chat message
WINDOWS = (8_000, 32_000, 128_000, 200_000)  # pre-registered: every one is reported, none is chosen


@dataclass
class Message:
    role: str
    text: str
    items: list[dict[str, Any]] = field(default_factory=list)  # memory items, with their span in `text`
    pinned: bool = False
    wire: dict[str, Any] = field(default_factory=dict)  # extra OpenAI fields: tool_calls, tool_call_id
    tokens: int = 0
    group: int = 0


class Transcript:
    def __init__(self, window: int | None, counter: TokenCounter | None = None) -> None:
        self.window = window
        self._counter = counter or token_counter()
        self.messages: list[Message] = []
        self.dropped_tokens = 0
        self.peak_tokens = 0
        self.hardware: str | None = None  # the hardware key the tools reported (the scripted agent reads it)
        self._groups = 0

    @property
    def tokens(self) -> int:
        return sum(m.tokens for m in self.messages)

    def add(self, role: str, text: str, *, items: list[dict[str, Any]] | None = None, pinned: bool = False,
            wire: dict[str, Any] | None = None) -> None:
        """Append a message; a tool result joins the group of the assistant message that called it."""
        if role != "tool" or not self.messages:
            self._groups += 1
        self.messages.append(Message(role, text, list(items or []), pinned, dict(wire or {}),
                                     self._counter.count(text) + MESSAGE_OVERHEAD, self._groups))
        self._trim()
        self.peak_tokens = max(self.peak_tokens, self.tokens)

    def _trim(self) -> None:
        if self.window is None:
            return
        while self.tokens > self.window:
            loose = [m for m in self.messages if not m.pinned]
            if not loose:
                return  # the pinned part alone is over the window: nothing a client could drop
            group = [m for m in loose if m.group == loose[0].group]
            if len(group) < len(loose):
                self._drop(group)  # something newer remains: the oldest exchange goes
                continue
            before = self.tokens
            self._cut_head(max(group, key=lambda m: m.tokens))  # only the newest exchange is left: cut it
            if self.tokens >= before:
                return

    def _drop(self, group: list[Message]) -> None:
        for m in group:
            self.dropped_tokens += m.tokens
            self.messages.remove(m)

    def _cut_head(self, message: Message) -> None:
        """Keep the most recent tokens of one message, so the whole transcript fits the window."""
        assert self.window is not None
        room = self.window - (self.tokens - message.tokens) - MESSAGE_OVERHEAD
        tail = self._counter.tail(message.text, max(0, room))
        cut = len(message.text) - len(tail)
        message.items = [{**i, "span": (i["span"][0] - cut, i["span"][1] - cut)} for i in message.items
                         if i["span"][0] >= cut]
        before = message.tokens
        message.text = tail
        message.tokens = self._counter.count(tail) + MESSAGE_OVERHEAD
        self.dropped_tokens += before - message.tokens

    def visible_items(self) -> list[dict[str, Any]]:
        """The memory items still inside the window, each once (its most recent reading)."""
        seen: dict[str, dict[str, Any]] = {}
        for message in self.messages:
            for item in message.items:
                seen.pop(item["id"], None)
                seen[item["id"]] = item
        return list(seen.values())

    def wire_messages(self) -> list[dict[str, Any]]:
        """The kept messages in the OpenAI chat format."""
        return [{"role": m.role, "content": m.text, **m.wire} for m in self.messages]
