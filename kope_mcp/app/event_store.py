"""Resumable HTTP streams: what a call sent on its event stream is kept, so a client whose connection dropped in the
middle of a long profile reconnects with `Last-Event-ID` and gets the rest (its progress and its answer).

The SDK keys stored events by stream id, which is the request's JSON-RPC id: the same few ids in every session. So
each session gets a store of its own (`per_session`), bounded in events and bytes, and gone with the session; an
event id names an event in its own session's store only, and another session's client asking for it gets nothing.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp.types import JSONRPCMessage

log = logging.getLogger(__name__)

# A session keeps at most this much of what it sent: enough for a profile's progress and its answer many times
# over, small beside the server's own memory even with every allowed session open.
MAX_EVENTS = 512
MAX_BYTES = 8 << 20
# What a client is told to wait before it reconnects a dropped stream (the SSE `retry` field).
RETRY_MS = 1000


@dataclass(frozen=True)
class _Event:
    seq: int
    stream: StreamId
    message: JSONRPCMessage | None
    size: int


class SessionEventStore(EventStore):
    """One session's events, oldest dropped first past MAX_EVENTS or MAX_BYTES."""

    def __init__(self, max_events: int = MAX_EVENTS, max_bytes: int = MAX_BYTES) -> None:
        self.max_events, self.max_bytes = max_events, max_bytes
        self.events: deque[_Event] = deque()
        self.bytes = 0
        self._seq = itertools.count(1)

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        size = 64 if message is None else len(message.model_dump_json(by_alias=True, exclude_unset=True)) + 64
        event = _Event(next(self._seq), stream_id, message, size)
        self.events.append(event)
        self.bytes += size
        while self.events and (len(self.events) > self.max_events or self.bytes > self.max_bytes):
            self.bytes -= self.events.popleft().size
        return str(event.seq)

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        if not last_event_id.isdigit():
            return None
        after = int(last_event_id)
        known = next((e for e in self.events if e.seq == after), None)
        if known is None:  # never ours, or dropped already: the client learns the stream cannot be resumed
            log.info("a client asked to resume after event %s, which this session no longer holds", after)
            return None
        for event in [e for e in self.events if e.seq > after and e.stream == known.stream]:
            if event.message is not None:
                await send_callback(EventMessage(event.message, str(event.seq)))
        return known.stream


def per_session(manager: Any) -> None:
    """Give every session the session manager admits a SessionEventStore of its own.

    The SDK hands its one event store to every session's transport; this wraps the manager's admission so each
    transport gets its own instead (a check in tests/e2e fails if the SDK stops calling it)."""
    admit = manager._admit_session

    def admit_with_store(*args: Any, **kwargs: Any) -> Any:
        transport = admit(*args, **kwargs)
        if transport is not None:
            transport._event_store = SessionEventStore()
        return transport

    manager._admit_session = admit_with_store
