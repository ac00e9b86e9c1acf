"""The profiling slot: a client that queues many profiles does not keep another waiting behind all of them."""

from __future__ import annotations

import threading
import time

from kope_mcp.services.fair_slot import FairSlot


def _queue(slot: FairSlot, client: str, order: list[str], waits: list[float]) -> threading.Thread:
    def run() -> None:
        with slot.hold(client) as waited:
            order.append(client)
            waits.append(waited)
            time.sleep(0.01)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _until_waiting(slot: FairSlot, count: int) -> None:
    deadline = time.monotonic() + 30
    while len(slot._waiting) < count:
        assert time.monotonic() < deadline, "the callers never queued"
        time.sleep(0.005)


def test_a_second_client_is_served_before_the_first_clients_queued_profiles():
    slot, order, waits = FairSlot(), [], []
    release = threading.Event()

    def first() -> None:
        with slot.hold("client-a"):
            order.append("client-a")
            release.wait(30)

    holder = threading.Thread(target=first, daemon=True)
    holder.start()
    deadline = time.monotonic() + 30
    while not order:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    threads = [_queue(slot, "client-a", order, waits) for _ in range(3)]
    _until_waiting(slot, 3)
    threads.append(_queue(slot, "client-b", order, waits))  # arrives last
    _until_waiting(slot, 4)
    release.set()
    for thread in [holder, *threads]:
        thread.join(30)
    assert order == ["client-a", "client-b", "client-a", "client-a", "client-a"]
    assert all(w >= 0 for w in waits) and len(waits) == 4


def test_among_equals_the_slot_goes_in_arrival_order():
    slot, order, waits = FairSlot(), [], []
    release = threading.Event()

    def first() -> None:
        with slot.hold("x"):
            release.wait(30)

    holder = threading.Thread(target=first, daemon=True)
    holder.start()
    _until_busy(slot)
    threads = []
    for client in ("c1", "c2", "c3"):
        threads.append(_queue(slot, client, order, waits))
        _until_waiting(slot, len(threads))
    release.set()
    for thread in [holder, *threads]:
        thread.join(30)
    assert order == ["c1", "c2", "c3"]


def _until_busy(slot: FairSlot) -> None:
    deadline = time.monotonic() + 30
    while not slot._busy:
        assert time.monotonic() < deadline
        time.sleep(0.005)


def test_each_clients_share_of_the_slot_is_its_part_of_the_recent_use():
    slot = FairSlot()
    assert slot.share("a") == 0.0
    held = {}
    for client, seconds in (("a", 0.06), ("b", 0.02)):
        start = time.monotonic()
        with slot.hold(client):
            time.sleep(seconds)
        held[client] = time.monotonic() - start
    # Use decays with a 60 s half-life: over the test's fraction of a second, the shares are the times held.
    assert abs(slot.share("a") - held["a"] / (held["a"] + held["b"])) < 0.02
    assert abs(slot.share("a") + slot.share("b") - 1.0) < 1e-9
    assert slot.queue == 0


def test_a_cancelled_waiter_leaves_the_queue_at_once_and_the_next_one_gets_the_slot():
    from kope_mcp.errors import CancelledCallError
    from kope_mcp.runtime import cancel

    slot, order, waits = FairSlot(), [], []
    release = threading.Event()
    token = cancel.CallToken()
    outcome: list[str] = []

    def holder() -> None:
        with slot.hold("client-a"):
            order.append("client-a")
            release.wait(30)

    def cancelled() -> None:
        with cancel.bound(token):
            try:
                with slot.hold("client-b"):
                    outcome.append("held")
            except CancelledCallError:
                outcome.append("cancelled")

    first = threading.Thread(target=holder, daemon=True)
    first.start()
    deadline = time.monotonic() + 30
    while not order:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    waiter = threading.Thread(target=cancelled, daemon=True)
    waiter.start()
    _until_waiting(slot, 1)
    later = _queue(slot, "client-c", order, waits)
    _until_waiting(slot, 2)
    token.cancel()
    waiter.join(10)
    assert outcome == ["cancelled"] and not waiter.is_alive()  # while client-a still holds the slot
    assert slot.queue == 2  # client-a holding, client-c waiting
    release.set()
    for thread in (first, later):
        thread.join(30)
    assert order == ["client-a", "client-c"]
