import threading
import time

import pytest

from kope_mcp.errors import CancelledCallError
from kope_mcp.runtime import cancel
from kope_mcp.services.turns import Turns


def test_at_most_the_given_number_hold_a_turn_and_a_cancelled_waiter_leaves_at_once():
    turns = Turns(1, "the wait for a test turn")
    token = cancel.CallToken()
    outcome: list[object] = []

    def wait() -> None:
        with cancel.bound(token):
            try:
                with turns.turn():
                    outcome.append("got it")
            except CancelledCallError as exc:
                outcome.append(exc)

    with turns.turn():
        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.3)
        assert outcome == [] and turns.taken == 1
        token.cancel()
        waiter.join(timeout=10)
        assert len(outcome) == 1 and isinstance(outcome[0], CancelledCallError)
        assert "test turn" in str(outcome[0])
    assert turns.taken == 0
    with turns.turn():
        assert turns.taken == 1


def test_a_turn_is_given_back_when_its_holder_fails():
    turns = Turns(1, "x")
    with pytest.raises(RuntimeError), turns.turn():
        raise RuntimeError("boom")
    assert turns.taken == 0
