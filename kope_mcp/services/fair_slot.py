"""The profiling slot, shared fairly between clients.

Profiles never overlap (a second measurement on a small machine would be the first one's noisy neighbour), so
they queue. A plain lock let one client that profiles back to back take the slot again and again while another
waited (100 s seen); here, when the slot frees, it goes to the waiting call whose client has used the slot least
lately (use decays with a half-life of HALF_LIFE_S), the earliest among equals. Each call learns how long it
waited, and the profile reports it. A waiter whose call is cancelled leaves the queue at once.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Iterator

from kope_mcp.errors import CancelledCallError
from kope_mcp.runtime import cancel

HALF_LIFE_S = 60.0


class FairSlot:
    def __init__(self, half_life_s: float = HALF_LIFE_S) -> None:
        self.half_life_s = half_life_s
        self._cond = threading.Condition()
        self._busy = False
        self._waiting: dict[int, str] = {}  # ticket -> client, in arrival order
        self._used: dict[str, tuple[float, float]] = {}  # client -> (decayed seconds in the slot, as of when)
        self._tickets = itertools.count()

    def usage(self, client: str, now: float | None = None) -> float:
        seconds, since = self._used.get(client, (0.0, 0.0))
        now = time.monotonic() if now is None else now
        return seconds * 0.5 ** ((now - since) / self.half_life_s)

    @contextlib.contextmanager
    def hold(self, client: str) -> Iterator[float]:
        """Hold the slot for ``client``; yields the seconds it waited for it."""
        queued = time.monotonic()
        with self._cond:
            ticket = next(self._tickets)
            self._waiting[ticket] = client
            try:
                with cancel.on_cancel(self._wake):
                    while self._busy or self._next() != ticket:
                        _unless_cancelled()
                        self._cond.wait()
                    _unless_cancelled()
            finally:
                del self._waiting[ticket]
                if not self._busy:
                    self._cond.notify_all()  # a cancelled waiter must not leave the next one asleep
            self._busy = True
        started = time.monotonic()
        try:
            yield started - queued
        finally:
            with self._cond:
                now = time.monotonic()
                self._used[client] = (self.usage(client, now) + (now - started), now)
                self._busy = False
                self._cond.notify_all()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def share(self, client: str) -> float:
        """``client``'s part of the slot's recent use (0-1)."""
        with self._cond:
            now = time.monotonic()
            total = sum(self.usage(c, now) for c in self._used)
            return self.usage(client, now) / total if total > 0 else 0.0

    @property
    def queue(self) -> int:
        """Calls holding or waiting for the slot now."""
        with self._cond:
            return len(self._waiting) + int(self._busy)

    def _next(self) -> int:
        now = time.monotonic()
        return min(self._waiting, key=lambda t: (self.usage(self._waiting[t], now), t))


def _unless_cancelled() -> None:
    if cancel.cancelled():
        raise CancelledCallError("the wait for the measurement slot")
