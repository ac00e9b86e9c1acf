"""call_service: a handler cancelled while its service runs in a thread stops the service and sends nothing more."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import anyio

from kope_mcp.errors import CancelledCallError
from kope_mcp.runtime import cancel
from kope_mcp.tools._context import call_service


def test_a_cancelled_handler_stops_its_service_at_its_next_progress_and_sends_nothing_after_the_cancel():
    sent: list[tuple[float, float]] = []
    cancelled_at: list[float] = []
    ended: dict[str, Any] = {}
    started = threading.Event()

    async def report_progress(done: float, total: float, message: str) -> None:
        sent.append((time.monotonic(), done))

    def service(progress: Any) -> str:
        started.set()
        try:
            for step in range(10_000):
                progress(step, 10_000, "working")
                time.sleep(0.002)
            return "finished"
        except CancelledCallError as exc:
            ended["error"] = exc
            raise
        finally:
            ended["token_cancelled"] = cancel.current() is not None and cancel.current().cancelled  # type: ignore[union-attr]

    async def body() -> None:
        ctx: Any = SimpleNamespace(report_progress=report_progress)
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: call_service(ctx, service, progress=True))
                await anyio.to_thread.run_sync(started.wait)
                await anyio.sleep(0.2)
                cancelled_at.append(time.monotonic())
                tg.cancel_scope.cancel()

    anyio.run(body)
    assert isinstance(ended.get("error"), CancelledCallError) and ended["token_cancelled"]
    assert sent and all(when <= cancelled_at[0] for when, _ in sent)


def test_a_service_that_finishes_returns_its_value_and_its_error_unchanged():
    async def body() -> tuple[Any, Any]:
        ctx: Any = SimpleNamespace()
        value = await call_service(ctx, lambda x: x * 2, 21)
        try:
            await call_service(ctx, lambda: (_ for _ in ()).throw(ValueError("kept")))
        except ValueError as exc:
            return value, exc
        return value, None

    value, error = anyio.run(body)
    assert value == 42 and str(error) == "kept"


def test_a_long_silent_step_is_repeated_every_heartbeat_with_its_elapsed_time_and_a_rising_value(monkeypatch):
    from kope_mcp.tools import _context

    monkeypatch.setattr(_context, "HEARTBEAT_S", 0.2)
    sent: list[tuple[float, float, str]] = []

    async def report_progress(done: float, total: float, message: str) -> None:
        sent.append((done, total, message))

    def service(progress: Any) -> str:
        progress(0, 3, "waiting for the measurement slot")
        progress(1, 3, "drawing inputs")
        time.sleep(1.2)  # one long step, silent
        progress(2, 3, "measuring")
        progress(3, 3, "done")
        time.sleep(0.6)  # after the last step nothing more is said
        return "ok"

    async def body() -> str:
        ctx: Any = SimpleNamespace(report_progress=report_progress)
        with anyio.fail_after(30):
            return await call_service(ctx, service, progress=True)

    assert anyio.run(body) == "ok"
    values = [done for done, _, _ in sent]
    assert values == sorted(values) and len(set(values)) == len(values), values
    beats = [message for done, _, message in sent if 1 < done < 2]
    assert len(beats) >= 2 and all(m.startswith("drawing inputs (") and m.endswith(" s)") for m in beats), sent
    assert [m for _, _, m in sent][-1] == "done"
    assert all(done < 2 for done, _, m in sent if m.startswith("drawing inputs"))


def test_a_call_without_progress_sends_no_heartbeat(monkeypatch):
    from kope_mcp.tools import _context

    monkeypatch.setattr(_context, "HEARTBEAT_S", 0.05)
    sent: list[Any] = []

    async def report_progress(*args: Any) -> None:
        sent.append(args)

    async def body() -> str:
        ctx: Any = SimpleNamespace(report_progress=report_progress)
        return await call_service(ctx, lambda: time.sleep(0.4) or "ok")

    assert anyio.run(body) == "ok" and sent == []
