"""What the profile's coordinator watches about the processes it runs (the child side, inside the sandbox).

- ``CpuUsage``: the candidate's CPU time against the windows it was resumed for, its threads' CPU masks, and the
  CPU it spent where nothing is timed: threads are measured, not declared.
- ``Scheduling``: the trusted workers' and the coordinator's policy, nice value and CPU masks, which a candidate
  running as the same identity could change; a change ends the measurement (``TamperedError``).

Only the standard library and ctypes, like the rest of the harness.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import time
from dataclasses import dataclass

_CLOCK_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
_libc = ctypes.CDLL(None, use_errno=True)


class _TimeSpec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class TamperedError(Exception):
    pass


@dataclass(frozen=True)
class Scheduling:
    """What decides how fast a process runs beside others: policy, nice value, CPU mask (every thread)."""

    policy: int
    nice: int
    # The distinct masks of its threads: a thread the worker starts later (a BLAS pool on the reference's first
    # call) inherits its creator's mask and changes nothing here.
    cpus: frozenset[tuple[int, ...]]

    @classmethod
    def of(cls, pid: int) -> Scheduling:
        try:
            threads = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
        except OSError:
            threads = [pid]
        masks = set()
        for tid in threads:
            with contextlib.suppress(OSError):
                masks.add(tuple(sorted(os.sched_getaffinity(tid))))
        try:
            return cls(os.sched_getscheduler(pid), os.getpriority(os.PRIO_PROCESS, pid), frozenset(masks))
        except OSError:
            return cls(-1, 0, frozenset(masks))

    def describe(self) -> str:
        cpus = sorted({c for mask in self.cpus for c in mask})
        return f"policy {self.policy}, nice {self.nice}, CPUs {cpus}"


class CpuUsage:
    """The candidate process's CPU time (every thread, the ones that ended included) against the wall time of the
    windows it was allowed to run in, and its threads' CPU masks: threads are measured, not declared."""

    def __init__(self, pid: int, pinned: int | None) -> None:
        self.pid, self.pinned = pid, pinned
        self.cpu_s = self.wall_s = 0.0
        self._mark = self._started = 0.0
        self.widened = False
        self.warmup_cpu_s = 0.0

    def _ticks(self) -> float:
        """The process's CPU time in seconds: its POSIX CPU clock (ns, every thread, ended ones included). The
        10 ms ticks of /proc/PID/stat are the fallback: over the 30-60 ms a short profile times a fast kernel,
        one tick of rounding alone made a single-threaded kernel look like 1.4 CPUs."""
        clock = ctypes.c_int()
        now = _TimeSpec()
        if _libc.clock_getcpuclockid(self.pid, ctypes.byref(clock)) == 0 and \
                _libc.clock_gettime(clock.value, ctypes.byref(now)) == 0:
            return now.tv_sec + now.tv_nsec / 1e9
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) * _CLOCK_TICK_S
        except (OSError, IndexError, ValueError):
            return self._mark

    def reset(self) -> None:
        """The measured batches begin: what the windows used so far was the warm-up call's."""
        self.warmup_cpu_s = self.cpu_s
        self.cpu_s = self.wall_s = 0.0

    def untimed(self) -> float:
        """CPU time the candidate's process spent outside its measured batches: loading, its warm-up call, and
        whatever its constructors or that call did besides (work done there is never timed)."""
        return max(0.0, self._ticks() - self.cpu_s)

    def before(self) -> None:
        self._mark = self._ticks()
        self._started = time.monotonic()

    def after(self) -> None:
        """The window from resuming the candidate to its reply: its process is stopped outside such windows, so
        one thread can use at most the window's wall time (the worker's own Python around the calls included);
        more CPU than that is more threads, whatever the kernel claims."""
        self.cpu_s += self._ticks() - self._mark
        self.wall_s += time.monotonic() - self._started
        self.widened = self.widened or self._mask_widened()

    def escaped_mask(self) -> bool:
        return self.widened or self._mask_widened()

    def _mask_widened(self) -> bool:
        """A thread of the candidate allowed on CPUs beyond the one it was given (checked after every batch, while
        it is stopped: a kernel that restores its mask before returning still shows in its CPU time)."""
        if self.pinned is None:
            return False
        try:
            threads = os.listdir(f"/proc/{self.pid}/task")
        except OSError:
            return False
        for tid in threads:
            with contextlib.suppress(OSError, ValueError):
                if os.sched_getaffinity(int(tid)) != {self.pinned}:
                    return True
        return False
