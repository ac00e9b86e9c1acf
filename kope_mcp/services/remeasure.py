"""Noisy results measured again, in the background, when the machine is quiet (issue 41, deliver 7).

A profile taken beside other work is often `noisy` (per-round spread over 25%): recorded, never taught, unless its
whole CI clears the gain threshold anyway. Such a result is the best evidence the memory has about that kernel, and
nobody asks for it again: an agent moves on. So the server itself profiles it again, with nobody waiting: when its
measurement slot is free, no profile has been asked for in the last ``idle_s``, and the load average per CPU is
below ``quiet_load``. The new measurement is an ordinary profile of the same kernel (`Workbench.profile_kernel`),
recorded over the old one: a clean win is promoted (it teaches from then on), any other clean result is settled
as what it measured (it teaches that), a result noisy again stays untaught and is tried at most ``tries`` times
per server, then dropped from the queue. Only this home's
own attempts are measured (an imported one is evidence from elsewhere: `kope memory import --reverify`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kope_mcp.errors import KopeError
from kope_mcp.memory.records import AgentInfo
from kope_mcp.services.workbench import Workbench

log = logging.getLogger(__name__)
REMEASURE_AGENT = AgentInfo(name="kope background re-measure")


@dataclass(frozen=True)
class RemeasureConfig:
    every_s: float = 300.0  # how often to look (0: never)
    quiet_load: float = 0.5  # 1-minute load average per CPU below which the machine counts as quiet
    idle_s: float = 60.0  # no profile asked for in this long: nobody is waiting for the slot
    tries: int = 2  # measurements per kernel per server, then it is left as it stands
    batch: int = 20  # noisy attempts looked at per round, fastest first


@dataclass
class Remeasured:
    kernel_id: str
    outcome: str  # "promoted", "settled", "still noisy", "suspect", "failed: ...", "not measured: ..."
    label: str | None = None
    speedup: float | None = None


def machine_load() -> float:
    """The 1-minute load average per CPU this process may use."""
    return os.getloadavg()[0] / max(1, len(os.sched_getaffinity(0)))


@dataclass
class Remeasurer:
    workbench: Workbench
    config: RemeasureConfig = field(default_factory=RemeasureConfig)
    load: Callable[[], float] = machine_load
    tried: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def quiet(self) -> str | None:
        """Why now is not the time (None: it is)."""
        load = self.load()
        if load >= self.config.quiet_load:
            return f"load {load:.2f} per CPU"
        if self.workbench.measure_slot("c").queue:
            return "a profile is running"
        since = time.monotonic() - self.workbench.last_profile_request
        if since < self.config.idle_s:
            return f"a profile was asked for {since:.0f} s ago"
        return None

    def next_kernel(self) -> str | None:
        for attempt in self.workbench.memory.noisy_attempts(self.config.batch):
            if self.tried.get(attempt.kernel_id, 0) < self.config.tries and attempt.target == "c":
                return attempt.kernel_id
        return None

    def run_once(self) -> Remeasured | None:
        """Measure one noisy attempt again if the machine is quiet; None when there was nothing to do."""
        if self.quiet() is not None:
            return None
        kernel_id = self.next_kernel()
        if kernel_id is None:
            return None
        self.tried[kernel_id] = self.tried.get(kernel_id, 0) + 1
        try:
            report = self.workbench.profile_kernel(kernel_id, agent=REMEASURE_AGENT, background=True)
        except KopeError as exc:  # its build gone, its task removed, a stopping server: left as it stands
            return Remeasured(kernel_id, f"not measured: {exc}")
        record = self.workbench.memory.attempt(kernel_id)
        if report.failure is not None:
            outcome = f"failed: {report.failure}"
        elif record.suspect:
            outcome = "suspect"
        elif record.noisy:
            outcome = "still noisy"
        else:
            outcome = "promoted" if record.label == "effective" else "settled"
        result = Remeasured(kernel_id, outcome, record.label, record.speedup)
        log.info("background re-measure of %s: %s (%s, %s)", kernel_id, outcome, record.label,
                 f"{record.speedup:.2f}x" if record.speedup is not None else "no speedup")
        return result

    def start(self) -> None:
        """Look every ``every_s`` seconds in a thread of its own, until :meth:`stop`."""
        if self.config.every_s <= 0 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="kope-remeasure", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        while not self._stop.wait(self.config.every_s):
            try:
                self.run_once()
            except Exception:  # a bug here must never take the server down with it
                log.exception("background re-measure failed")
