"""The judge: after every arm has worked a task, each arm's incumbents are re-profiled in one interleaved pass
through one server of their own, and every metric reads those numbers, never the arm's own.

Why: each arm measured its kernels in its own run, at its own moment, beside its own server's work (passive's
arms read a large history every iteration). In the run this replaced, identical kernels came out lower in
passive's profiles in 35 of 52 pairs (geomean x0.952), and on relu that alone decided the metric. Here a kernel
that two arms kept is one kernel (same source and flags) with one figure, and distinct kernels are profiled in
rounds with the order rotated, so a slow spell falls on all alike. The figure is the median of ``rounds``
profiles; a kernel whose every re-profile failed counts as the naive kernel (1.0), and the failures are counted.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from mcp import Client

from kope_mcp.bench.agent import TaskRun, call_tool
from kope_mcp.bench.measure import kernel_key

JUDGE_ROUNDS = 3


@dataclass
class Judgement:
    speedups: dict[str, float] = field(default_factory=dict)  # kernel key -> median re-profiled speedup
    failed: list[str] = field(default_factory=list)  # keys none of whose re-profiles gave a speedup
    passes: dict[str, list[float | None]] = field(default_factory=dict)  # key -> each pass's figure (test-retest)


async def judge_task(client: Client, task_id: str, runs: list[TaskRun], rounds: int = JUDGE_ROUNDS) -> Judgement:
    """Re-profile every kernel any of `runs` (one task, every arm) kept, in `rounds` interleaved rounds; fill
    each run's ``judged`` curve from the figures; returns them."""
    kernels: dict[str, tuple[str, list[str]]] = {}
    for run in runs:
        for attempt_no, source, flags in run.kept:
            if attempt_no > 0:
                kernels.setdefault(kernel_key(source, flags), (source, list(flags)))
    ids: dict[str, str] = {}
    for key, (source, flags) in kernels.items():
        compiled = await call_tool(client, "compile_kernel", task_id=task_id, source=source, flags=flags,
                                   strategy="re-profile", agent="judge")
        if compiled["ok"] and (await call_tool(client, "run_tests", kernel_id=compiled["kernel_id"]))["passed"]:
            ids[key] = compiled["kernel_id"]
    judgement = Judgement()
    figures: dict[str, list[float]] = {key: [] for key in ids}
    order = sorted(ids)
    for r in range(rounds):
        for key in order[r % max(1, len(order)):] + order[:r % max(1, len(order))]:
            profile: dict[str, Any] = await call_tool(client, "profile_kernel", kernel_id=ids[key],
                                                      time_reference=False)
            if not profile.get("failure") and profile.get("speedup_vs_baseline") is not None:
                figures[key].append(float(profile["speedup_vs_baseline"]))
                judgement.passes.setdefault(key, []).append(round(float(profile["speedup_vs_baseline"]), 5))
            else:
                judgement.passes.setdefault(key, []).append(None)
    for key in kernels:
        if figures.get(key):
            judgement.speedups[key] = statistics.median(figures[key])
        else:
            judgement.speedups[key] = 1.0
            judgement.failed.append(key)
    for run in runs:
        run.judged = judged_curve(run, judgement.speedups)
    return judgement


def judged_curve(run: TaskRun, speedups: dict[str, float]) -> list[float]:
    """The incumbent's judged speedup after each of the run's attempts (the naive kernel is 1.0)."""
    changes = {int(a): (1.0 if int(a) == 0 else speedups.get(kernel_key(src, list(fl)), 1.0))
               for a, src, fl in run.kept}
    curve, current = [], 1.0
    for k in range(1, run.attempts + 1):
        current = changes.get(k, current)
        curve.append(current)
    return curve
