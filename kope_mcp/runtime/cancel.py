"""A call its client cancelled: its sandboxes end at once, its waits give up, and nothing of it is recorded.

The MCP handler runs the service in a worker thread, which anyio cannot interrupt. So the handler binds a
:class:`CallToken` to the call (a context variable: the worker thread runs in a copy of the handler's context) and
cancels it when the client's ``notifications/cancelled`` (or its disconnect) cancels the handler. Whatever the call
is waiting on registers how to stop waiting: a sandbox run its kill (``sandbox.finish``), the measurement slot a
wake-up (``FairSlot.hold``). The service checks :func:`cancelled` before it records anything.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import threading
from collections.abc import Callable, Iterator


class CallToken:
    """One call's cancellation: set once, from any thread; every registered stop runs once it is set."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = threading.Event()
        self._stops: dict[int, Callable[[], None]] = {}
        self._ids = itertools.count()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        with self._lock:
            if self._cancelled.is_set():
                return
            self._cancelled.set()
            stops = list(self._stops.values())
        for stop in stops:
            with contextlib.suppress(Exception):  # one stop failing must not keep the others from running
                stop()

    @contextlib.contextmanager
    def on_cancel(self, stop: Callable[[], None]) -> Iterator[None]:
        """Run ``stop`` when the call is cancelled while inside the block (at once if it already was)."""
        key = next(self._ids)
        with self._lock:
            already = self._cancelled.is_set()
            if not already:
                self._stops[key] = stop
        if already:
            stop()
        try:
            yield
        finally:
            with self._lock:
                self._stops.pop(key, None)


_current: contextvars.ContextVar[CallToken | None] = contextvars.ContextVar("kope_call_token", default=None)


def current() -> CallToken | None:
    """The token of the call this thread works for, if a handler bound one."""
    return _current.get()


@contextlib.contextmanager
def bound(token: CallToken) -> Iterator[CallToken]:
    reset = _current.set(token)
    try:
        yield token
    finally:
        _current.reset(reset)


@contextlib.contextmanager
def on_cancel(stop: Callable[[], None]) -> Iterator[None]:
    """:meth:`CallToken.on_cancel` for the current call; nothing where no call is bound (a background job)."""
    token = current()
    if token is None:
        yield
        return
    with token.on_cancel(stop):
        yield


def cancelled() -> bool:
    """Whether the call this thread works for was cancelled (never, where no call is bound: a background job).
    The services raise ``errors.CancelledCallError``: the runtime beside untrusted code imports none of them."""
    token = current()
    return token is not None and token.cancelled
