"""A call's cancellation on its own: what registers a stop has it run once, and a cancelled run ends at once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from kope_mcp.runtime import cancel
from kope_mcp.runtime.sandbox import SandboxLimits, Scratch, capabilities, run_sandboxed, scrubbed_env


def test_every_stop_registered_while_the_call_runs_is_run_once_and_a_late_one_at_once():
    token = cancel.CallToken()
    ran: list[str] = []
    with token.on_cancel(lambda: ran.append("inside")):
        with token.on_cancel(lambda: 1 / 0):  # a failing stop does not keep the others from running
            token.cancel()
            token.cancel()
        with token.on_cancel(lambda: ran.append("late")):
            pass
    with token.on_cancel(lambda: ran.append("after")):
        pass
    assert ran == ["inside", "late", "after"]


def test_a_stop_whose_block_has_ended_is_not_run():
    token = cancel.CallToken()
    ran: list[str] = []
    with token.on_cancel(lambda: ran.append("left")):
        pass
    token.cancel()
    assert ran == []


def test_a_thread_knows_its_call_was_cancelled_and_a_thread_without_a_call_never_is():
    assert not cancel.cancelled()  # nothing bound: a background job, never cancelled
    token = cancel.CallToken()
    with cancel.bound(token):
        assert not cancel.cancelled()
        token.cancel()
        assert cancel.cancelled()
    assert cancel.current() is None and not cancel.cancelled()


@pytest.mark.skipif(not capabilities().isolated, reason="no isolation on this machine")
def test_a_run_of_a_cancelled_call_ends_at_once_and_a_run_of_another_call_goes_on(tmp_path: Path):
    limits = SandboxLimits(wall_seconds=30, cpu_seconds=30)
    token, other = cancel.CallToken(), cancel.CallToken()
    results: dict[str, object] = {}

    def run(name: str, call: cancel.CallToken, script: str) -> None:
        with cancel.bound(call), Scratch(tmp_path / name) as scratch:
            results[name] = run_sandboxed(["/bin/sh", "-c", script], scratch=scratch, limits=limits,
                                          env=scrubbed_env())

    doomed = threading.Thread(target=run, args=("doomed", token, "sleep 25; echo finished"))
    kept = threading.Thread(target=run, args=("kept", other, "sleep 3; echo finished"))
    doomed.start()
    kept.start()
    time.sleep(1.0)
    start = time.monotonic()
    token.cancel()
    doomed.join(timeout=20)
    ended_s = time.monotonic() - start
    kept.join(timeout=30)
    assert not doomed.is_alive() and ended_s < 10, ended_s  # a kill, not the 25 s sleep
    assert "finished" not in results["doomed"].stdout_tail  # type: ignore[attr-defined]
    assert "finished" in results["kept"].stdout_tail  # type: ignore[attr-defined]
