"""run_tests' inputs in bounded memory: the fixed cases' cache drops the least recently used past its bound, and
at most DRAWN_AT_ONCE calls hold a drawn profiling-size case; a cancelled waiter leaves at once."""

from __future__ import annotations

import threading
import time

import numpy as np

from kope_mcp.errors import CancelledCallError
from kope_mcp.runtime import cancel
from kope_mcp.services.references import CaseData
from kope_mcp.services.test_inputs import CasePreparer
from kope_mcp.tasks.spec import CaseSpec


class CountingReferences:
    """A reference runner that makes arrays of 1 MiB per case and counts what it was asked for."""

    def __init__(self) -> None:
        self.made: list[str] = []

    def cases(self, task, items):
        self.made += [case.name for case, _ in items]
        return [CaseData({"x": np.zeros(1 << 17)}, [np.zeros(1 << 17)]) for _ in items]  # 2 MiB a case


class Task:
    id = "t"

    def case_seed(self, case, seed):
        return seed


def case(name: str) -> CaseSpec:
    return CaseSpec(name=name, sizes={"n": 4})


def test_fixed_cases_are_kept_and_the_least_recently_used_dropped_past_the_bound():
    references = CountingReferences()
    inputs = CasePreparer(references, cache_bytes=9 << 20)  # room for four 2 MiB cases
    for name in "abcd":
        inputs.prepared(Task(), [(case(name), 0, True)])
    inputs.prepared(Task(), [(case("a"), 0, True)])  # a is used again: b is now the oldest
    inputs.prepared(Task(), [(case("e"), 0, True)])
    assert inputs.cached_bytes <= 9 << 20
    references.made.clear()
    inputs.prepared(Task(), [(case(n), 0, True) for n in "acde"])
    assert references.made == []  # all still there
    inputs.prepared(Task(), [(case("b"), 0, True)])
    assert references.made == ["b"]  # dropped, made again


def test_a_drawn_case_is_never_cached():
    references = CountingReferences()
    inputs = CasePreparer(references)
    for _ in range(2):
        inputs.prepared(Task(), [(case("drawn"), 0, False)])
    assert references.made == ["drawn", "drawn"] and inputs.cached_bytes == 0


def test_at_most_drawn_at_once_calls_hold_a_drawn_case_and_the_rest_wait_their_turn():
    inputs = CasePreparer(CountingReferences(), drawn_at_once=2)
    most, lock = [0], threading.Lock()

    def call() -> None:
        with inputs.drawn_turn():
            with lock:
                most[0] = max(most[0], inputs.drawing)
            time.sleep(0.05)

    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert most[0] == 2 and inputs.drawing == 0


def test_a_cancelled_waiter_leaves_at_once_and_the_turn_goes_to_the_next():
    inputs = CasePreparer(CountingReferences(), drawn_at_once=1)
    release, token, outcome = threading.Event(), cancel.CallToken(), []
    held = threading.Event()

    def holder() -> None:
        with inputs.drawn_turn():
            held.set()
            release.wait(30)

    def waiter() -> None:
        with cancel.bound(token):
            try:
                with inputs.drawn_turn():
                    outcome.append("held")
            except CancelledCallError as exc:
                outcome.append(str(exc))

    first = threading.Thread(target=holder)
    first.start()
    assert held.wait(30)
    second = threading.Thread(target=waiter)
    second.start()
    time.sleep(0.1)
    token.cancel()
    second.join(10)
    assert not second.is_alive() and outcome and outcome[0].startswith("cancelled:")
    release.set()
    first.join(30)
    with inputs.drawn_turn():  # and the turn is free again
        assert inputs.drawing == 1


def test_one_case_over_a_quarter_of_the_bound_is_not_cached():
    inputs = CasePreparer(CountingReferences(), cache_bytes=4 << 20)
    inputs.prepared(Task(), [(case("big"), 0, True)])
    assert inputs.cached_bytes == 0
