"""run_tests' inputs and reference outputs, in bounded memory whatever the number of clients.

A task's fixed cases are small and asked for again and again: they are kept, least recently used dropped first past
CACHE_BYTES. The case drawn near the profiling size for each run is not (a fresh draw per call is the point), and is
large (vector_add's: ~0.25 GB with its float64 reference): at most DRAWN_AT_ONCE calls hold one at a time, the
others wait their turn, so eight clients testing at once hold two, not eight.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from kope_mcp.services.references import ReferenceRunner
from kope_mcp.services.turns import Turns
from kope_mcp.targets.native_runner import PreparedCase
from kope_mcp.tasks.loader import Task
from kope_mcp.tasks.spec import CaseSpec

CACHE_BYTES = 256 << 20
DRAWN_AT_ONCE = 2


@dataclass(frozen=True)
class Prepared:
    """One case run of run_tests: its inputs, the reference's outputs, and the case it came from."""

    case: PreparedCase
    expected: list[np.ndarray]
    spec: CaseSpec

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.case.inputs.values()) + sum(a.nbytes for a in self.expected)


class CasePreparer:
    def __init__(self, references: ReferenceRunner, cache_bytes: int = CACHE_BYTES,
                 drawn_at_once: int = DRAWN_AT_ONCE) -> None:
        self.references, self.cache_bytes, self.drawn_at_once = references, cache_bytes, drawn_at_once
        self._cache: OrderedDict[tuple[str, str, int], Prepared] = OrderedDict()
        self._cached_bytes = 0
        self._lock = threading.Lock()
        self._turns = Turns(drawn_at_once, "the wait to draw a test case")

    def prepared(self, task: Task, wanted: list[tuple[CaseSpec, int, bool]]) -> list[Prepared]:
        """Inputs and expected outputs for each (case, seed, cacheable); what is not cached yet is made in one
        go (one sandboxed run for a task that is not the package's)."""
        found: dict[int, Prepared] = {}
        with self._lock:
            for i, (case, seed, cache) in enumerate(wanted):
                key = (task.id, case.name, seed)
                if cache and key in self._cache:
                    self._cache.move_to_end(key)
                    found[i] = self._cache[key]
        missing = [i for i in range(len(wanted)) if i not in found]
        made = self.references.cases(task, [(wanted[i][0], task.case_seed(wanted[i][0], wanted[i][1]))
                                            for i in missing]) if missing else []
        for i, data in zip(missing, made, strict=True):
            case, seed, cache = wanted[i]
            found[i] = Prepared(PreparedCase(name=case.name, sizes=case.sizes, inputs=data.inputs), data.expected,
                                case)
            if cache:
                self._keep((task.id, case.name, seed), found[i])
        return [found[i] for i in range(len(wanted))]

    def _keep(self, key: tuple[str, str, int], item: Prepared) -> None:
        if item.nbytes > self.cache_bytes // 4:  # one huge case would push out everything else for little gain
            return
        with self._lock:
            if key in self._cache:
                return
            self._cache[key] = item
            self._cached_bytes += item.nbytes
            while self._cached_bytes > self.cache_bytes:
                _, dropped = self._cache.popitem(last=False)
                self._cached_bytes -= dropped.nbytes

    @property
    def cached_bytes(self) -> int:
        with self._lock:
            return self._cached_bytes

    def drawn_turn(self) -> contextlib.AbstractContextManager[None]:
        """Held while a call makes, runs and judges its drawn case; a cancelled waiter leaves at once."""
        return self._turns.turn()

    @property
    def drawing(self) -> int:
        return self._turns.taken
