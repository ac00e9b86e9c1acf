"""Turns: at most N calls at once hold something large (a drawn test case, a profile's input pool); the rest wait,
and a waiter whose call is cancelled leaves at once."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from kope_mcp.errors import CancelledCallError
from kope_mcp.runtime import cancel


class Turns:
    def __init__(self, at_once: int, waiting_for: str) -> None:
        self.at_once, self.waiting_for = at_once, waiting_for
        self._changed = threading.Condition()
        self._taken = 0

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        with self._changed:
            with cancel.on_cancel(self._wake):
                while self._taken >= self.at_once:
                    self._unless_cancelled()
                    self._changed.wait()
                self._unless_cancelled()
            self._taken += 1
        try:
            yield
        finally:
            with self._changed:
                self._taken -= 1
                self._changed.notify_all()  # all: a woken waiter may be one whose call was just cancelled

    @property
    def taken(self) -> int:
        with self._changed:
            return self._taken

    def _wake(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def _unless_cancelled(self) -> None:
        if cancel.cancelled():
            raise CancelledCallError(self.waiting_for)
