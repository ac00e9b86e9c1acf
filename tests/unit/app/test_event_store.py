"""A session's event store: replays one stream after an event it holds, bounded in events and bytes."""

from __future__ import annotations

import anyio
from mcp.server.streamable_http import EventMessage
from mcp.types import JSONRPCNotification, JSONRPCResponse

from kope_mcp.app.event_store import SessionEventStore


def progress(n: int, pad: str = "") -> JSONRPCNotification:
    return JSONRPCNotification(jsonrpc="2.0", method="notifications/progress",
                               params={"progressToken": "p", "progress": n, "message": pad})


def replay(store: SessionEventStore, after: str) -> tuple[str | None, list[EventMessage]]:
    sent: list[EventMessage] = []

    async def send(event: EventMessage) -> None:
        sent.append(event)

    async def run() -> str | None:
        return await store.replay_events_after(after, send)

    return anyio.run(run), sent


def test_a_replay_sends_the_later_events_of_that_stream_only_with_their_ids():
    store = SessionEventStore()

    async def fill() -> list[str]:
        return [await store.store_event("7", None), await store.store_event("7", progress(1)),
                await store.store_event("8", progress(99)), await store.store_event("7", progress(2)),
                await store.store_event("7", JSONRPCResponse(jsonrpc="2.0", id=7, result={}))]

    ids = anyio.run(fill)
    stream, sent = replay(store, ids[0])  # after the priming event
    assert stream == "7"
    assert [e.event_id for e in sent] == [ids[1], ids[3], ids[4]]
    assert isinstance(sent[-1].message, JSONRPCResponse)
    assert replay(store, ids[3])[1][0].event_id == ids[4]


def test_an_id_the_store_never_gave_or_has_dropped_replays_nothing():
    store = SessionEventStore(max_events=3)

    async def fill() -> list[str]:
        return [await store.store_event("1", progress(i)) for i in range(5)]

    ids = anyio.run(fill)
    assert len(store.events) == 3
    assert replay(store, ids[0]) == (None, [])  # dropped
    assert replay(store, "999") == (None, [])
    assert replay(store, "x; DROP") == (None, [])
    assert [e.event_id for e in replay(store, ids[2])[1]] == ids[3:]


def test_the_store_keeps_under_its_byte_bound_dropping_the_oldest():
    store = SessionEventStore(max_bytes=10_000)

    async def fill() -> None:
        for i in range(50):
            await store.store_event("1", progress(i, "x" * 1000))

    anyio.run(fill)
    assert store.bytes <= 10_000 and 5 <= len(store.events) <= 10
    assert store.events[-1].seq == 50
