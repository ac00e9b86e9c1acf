"""Metrics that can move, paired per (task, seed), with bootstrap confidence intervals.

The headline is attempts until the best kernel so far is within 90% of the best known speedup for the task
(fewer is better; a run that never gets there counts budget + 1). "Best known" is the best any arm reached on
that task in this run (every arm, every seed), so it is a floor on the truly best, the same floor for all arms.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kope_mcp.bench.agent import TaskRun

NEAR_BEST = 0.9
BOOTSTRAP_ROUNDS = 2000


def best_known(runs: Iterable[TaskRun]) -> dict[str, float]:
    best: dict[str, float] = {}
    for run in runs:
        best[run.task_id] = max(best.get(run.task_id, 1.0), run.best_speedup)
    return best


def attempts_to_near_best(run: TaskRun, best: float) -> int:
    for k, value in enumerate(run.best_by_attempt, 1):
        if value >= NEAR_BEST * best:
            return k
    return run.budget + 1


def reach_at(run: TaskRun, best: float, k: int) -> float:
    return 1.0 if attempts_to_near_best(run, best) <= k else 0.0


def failed_attempts(run: TaskRun) -> int:
    return run.outcomes.get("compile_error", 0) + run.outcomes.get("incorrect", 0)


def area_under_best(run: TaskRun) -> float:
    """Mean log best-so-far speedup over the budget (a run that stopped early carries its best on)."""
    points = run.best_by_attempt or [1.0]
    padded = points + [points[-1]] * (run.budget - len(points))
    return statistics.fmean(math.log(max(v, 1e-9)) for v in padded[:run.budget])


def first_attempt_correct(run: TaskRun) -> float:
    return 1.0 if run.first_correct == 1 else 0.0


@dataclass
class Paired:
    """Mean of metric(a) - metric(b) over the (task, seed) pairs both arms ran, with a 95% bootstrap CI."""

    a: str
    b: str
    mean: float
    low: float
    high: float
    pairs: int

    def verdict(self, lower_is_better: bool = True) -> str:
        if self.pairs == 0:
            return "no pairs"
        if self.low <= 0 <= self.high:
            return "ties"
        better = self.high < 0 if lower_is_better else self.low > 0
        return "beats" if better else "loses to"


def paired(by_arm: dict[str, list[TaskRun]], a: str, b: str, metric: Callable[[TaskRun], float],
           seed: int = 0) -> Paired:
    runs_b = {(r.task_id, r.seed): r for r in by_arm.get(b, [])}
    diffs = [metric(r) - metric(runs_b[(r.task_id, r.seed)]) for r in by_arm.get(a, [])
             if (r.task_id, r.seed) in runs_b]
    if not diffs:
        return Paired(a, b, float("nan"), float("nan"), float("nan"), 0)
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(diffs, k=len(diffs))) for _ in range(BOOTSTRAP_ROUNDS))
    return Paired(a, b, statistics.fmean(diffs), means[int(0.025 * BOOTSTRAP_ROUNDS)],
                  means[int(0.975 * BOOTSTRAP_ROUNDS) - 1], len(diffs))
