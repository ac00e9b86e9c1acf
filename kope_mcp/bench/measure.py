"""One measurement per distinct kernel, shared by every arm: the figure each arm accepts or rejects a candidate on.

Why: in the run this replaced each arm decided on its own short profile, so the same candidate kernel was kept by
one arm and rejected by another in 16 of 44 active-passive pairs, and those pairs carried 63% of the squared
differences: the noise of two profiles, not what the arms read, decided the comparison. Here a kernel (task,
source, flags; one machine, so one hardware) is profiled by a server of its own until the figure is known to a
stated width, once for the whole run, and every arm that writes the same kernel reads the same figure. Each arm
still profiles its candidate in its own server: that is what its memory records, as in real use; only the
decision is shared.

The figure: the geometric mean of `min_profiles` to `max_profiles` profiles' speedups, with a t interval on their
logs; profiling stops once the interval's half-width is within `width` (5%: half the effect of interest). A
kernel that fails at the profiling size fails for every arm. Kept in `measured.json` of the run's folder, so a
resumed run decides as the stopped one did.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mcp import Client

from kope_mcp.bench.tool_calls import call_tool

# Two-sided 97.5% quantiles of Student's t by degrees of freedom (1-9): the profiles are few.
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262)


def kernel_key(source: str, flags: list[str]) -> str:
    return hashlib.sha256((source + "\0" + " ".join(flags)).encode()).hexdigest()[:16]


@dataclass
class Figure:
    """A kernel's shared figure: its speedup over the naive baseline and the interval every arm decides on."""

    speedup: float | None  # None: it failed at the profiling size (`failure`) or nothing could be timed
    low: float = 0.0
    high: float = 0.0
    figures: list[float] = field(default_factory=list)  # each profile's speedup
    failure: str | None = None  # wrong_at_profile_size, timing_unverified, ... (the server's)
    suspect: bool = False  # most profiles were flagged suspect: never an incumbent

    @property
    def half_width(self) -> float:
        return half_width(self.low, self.high) if self.speedup else math.inf


def half_width(low: float, high: float) -> float:
    """An interval's half-width on the log scale, relative (0.05: within 5% either way)."""
    return math.sqrt(high / low) - 1 if low > 0 else math.inf


def log_interval(figures: list[float]) -> tuple[float, float, float]:
    """(geometric mean, low, high) of positive figures: a t interval on their logs (the extremes for one)."""
    logs = [math.log(max(f, 1e-9)) for f in figures]
    centre = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(centre), math.exp(centre), math.exp(centre)
    t = T975[len(logs) - 2] if len(logs) - 1 <= len(T975) else 1.96
    half = t * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(centre), math.exp(centre - half), math.exp(centre + half)


@dataclass
class MeasureConfig:
    width: float = 0.05  # the interval's relative half-width profiling stops at
    min_profiles: int = 3  # two profiles taken back to back can agree by chance and still be off together
    max_profiles: int = 6


class SharedMeasure:
    """The run's measurements, through `client` (a `kope serve` of its own), cached by kernel in `path`."""

    def __init__(self, client: Client, path: Path, config: MeasureConfig | None = None) -> None:
        self._client = client
        self._path = path
        self.config = config or MeasureConfig()
        self._known: dict[str, Figure] = {}
        if path.exists():
            self._known = {k: Figure(**v) for k, v in json.loads(path.read_text()).items()}

    def key(self, task_id: str, source: str, flags: list[str] | tuple[str, ...]) -> str:
        return f"{task_id}/{kernel_key(source, list(flags))}"

    def known(self, task_id: str, source: str, flags: list[str] | tuple[str, ...]) -> Figure | None:
        return self._known.get(self.key(task_id, source, flags))

    def speedups(self, task_id: str, kept: list[list[Any]]) -> dict[str, float]:
        """{kernel key: shared speedup} of the kernels a run kept ([attempt, source, flags]; 1.0 for one that
        has no figure), as judge.judged_curve reads them."""
        out: dict[str, float] = {}
        for _, source, flags in kept:
            figure = self.known(task_id, source, flags)
            out[kernel_key(source, list(flags))] = figure.speedup if figure is not None and figure.speedup else 1.0
        return out

    async def figure(self, task_id: str, source: str, flags: list[str] | tuple[str, ...]) -> Figure:
        """The kernel's figure, measured on first use. The caller has compiled and tested it in its own server;
        here it is compiled and tested again (a fresh server, the same verdict) and profiled."""
        key = self.key(task_id, source, flags)
        if key in self._known:
            return self._known[key]
        figure = await self._measure(task_id, source, list(flags))
        self._known[key] = figure
        self._path.write_text(json.dumps({k: asdict(v) for k, v in self._known.items()}, indent=1))
        return figure

    async def _measure(self, task_id: str, source: str, flags: list[str]) -> Figure:
        compiled = await call_tool(self._client, "compile_kernel", task_id=task_id, source=source, flags=flags,
                                   strategy="shared measurement", agent="bench-measure")
        if not compiled["ok"]:
            return Figure(None, failure="compile_error")
        tested = await call_tool(self._client, "run_tests", kernel_id=compiled["kernel_id"])
        if not tested["passed"]:
            return Figure(None, failure=str(tested.get("failure") or "incorrect"))
        figures: list[float] = []
        suspects = 0
        failure: str | None = None
        for _ in range(self.config.max_profiles):
            profile: dict[str, Any] = await call_tool(self._client, "profile_kernel",
                                                      kernel_id=compiled["kernel_id"], time_reference=False)
            if profile.get("failure"):
                failure = str(profile["failure"])
                if failure != "timing_unverified":
                    return Figure(None, failure=failure)  # wrong at the profiling size: wrong for every arm
                continue
            figures.append(float(profile["speedup_vs_baseline"]))
            suspects += bool(profile.get("suspect"))
            if len(figures) >= max(2, self.config.min_profiles) and \
                    half_width(*log_interval(figures)[1:]) <= self.config.width:
                break
        if not figures:
            return Figure(None, failure=failure or "timing_unverified")
        speedup, low, high = log_interval(figures)
        return Figure(round(speedup, 5), round(low, 5), round(high, 5), [round(f, 5) for f in figures],
                      suspect=suspects * 2 > len(figures))


def measurably_faster(figure: Figure, incumbent: float) -> bool:
    """The decision every arm makes on a shared figure: measurably faster than the incumbent's figure (the
    interval's lower end above it) and not suspect."""
    return figure.speedup is not None and not figure.suspect and figure.low > incumbent
