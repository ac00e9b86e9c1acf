"""Metrics that can move, paired per (task, seed), with bootstrap confidence intervals, sign-flip p-values,
Holm's correction and the minimum detectable difference (docs/ablation.md pre-registers which is which).

Every metric reads a run's ``curve``: its incumbent's speedup after each attempt as the judge re-profiled it
(judge.py). The primary metric is the area under the log of that curve (continuous, higher is better); the
secondary is attempts until the incumbent is within 90% of the best known speedup (fewer is better; a run that
never gets there counts budget + 1). "Best known" is the best judged incumbent of any arm on that task (every
arm, every seed) or the catalogue's, whichever is higher: the same floor for all arms.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from statistics import NormalDist

from kope_mcp.bench.agent import TaskRun

NEAR_BEST = 0.9
BOOTSTRAP_ROUNDS = 2000


def best_known(runs: Iterable[TaskRun]) -> dict[str, float]:
    best: dict[str, float] = {}
    for run in runs:
        best[run.task_id] = max(best.get(run.task_id, 1.0), max(run.curve, default=1.0))
    return best


def attempts_to_near_best(run: TaskRun, best: float) -> int:
    for k, value in enumerate(run.curve, 1):
        if value >= NEAR_BEST * best:
            return k
    return run.budget + 1


def reach_at(run: TaskRun, best: float, k: int) -> float:
    return 1.0 if attempts_to_near_best(run, best) <= k else 0.0


def failed_attempts(run: TaskRun) -> int:
    return run.outcomes.get("compile_error", 0) + run.outcomes.get("incorrect", 0)


def area_under_best(run: TaskRun) -> float:
    """Mean log incumbent speedup over the budget (a run that stopped early carries its last on): the primary
    metric."""
    points = run.curve or [1.0]
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
            return "shows no difference from"  # a CI containing 0 is not evidence of equality
        better = self.high < 0 if lower_is_better else self.low > 0
        return "beats" if better else "loses to"


def paired(by_arm: dict[str, list[TaskRun]], a: str, b: str, metric: Callable[[TaskRun], float],
           seed: int = 0) -> Paired:
    diffs = paired_differences(by_arm, a, b, metric)
    if not diffs:
        return Paired(a, b, float("nan"), float("nan"), float("nan"), 0)
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(diffs, k=len(diffs))) for _ in range(BOOTSTRAP_ROUNDS))
    return Paired(a, b, statistics.fmean(diffs), means[int(0.025 * BOOTSTRAP_ROUNDS)],
                  means[int(0.975 * BOOTSTRAP_ROUNDS) - 1], len(diffs))


def bootstrap_interval(values: list[float], level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """A bootstrap CI of the mean at `level` (nan for no values)."""
    if not values:
        return float("nan"), float("nan")
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(BOOTSTRAP_ROUNDS))
    tail = (1 - level) / 2
    return means[int(tail * BOOTSTRAP_ROUNDS)], means[int((1 - tail) * BOOTSTRAP_ROUNDS) - 1]


def paired_differences(by_arm: dict[str, list[TaskRun]], a: str, b: str,
                       metric: Callable[[TaskRun], float]) -> list[float]:
    runs_b = {(r.task_id, r.seed): r for r in by_arm.get(b, [])}
    return [metric(r) - metric(runs_b[(r.task_id, r.seed)]) for r in by_arm.get(a, [])
            if (r.task_id, r.seed) in runs_b]


def sign_flip_p(diffs: list[float], seed: int = 0, rounds: int = 20_000) -> float:
    """Two-sided p-value of the paired differences' mean under the null of symmetry around 0 (each sign
    flipped at random; exact enumeration up to 16 pairs). No normality assumed."""
    n = len(diffs)
    if n == 0:
        return float("nan")
    observed = abs(statistics.fmean(diffs))
    if n <= 16:
        extreme = sum(abs(sum(d if mask >> i & 1 else -d for i, d in enumerate(diffs)) / n) >= observed - 1e-12
                      for mask in range(2 ** n))
        return extreme / 2 ** n
    rng = random.Random(seed)
    extreme = sum(abs(statistics.fmean(d if rng.random() < 0.5 else -d for d in diffs)) >= observed - 1e-12
                  for _ in range(rounds))
    return (extreme + 1) / (rounds + 1)


def holm(pvalues: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (same order as given; NaN stays NaN)."""
    indexed = sorted((p, i) for i, p in enumerate(pvalues) if not math.isnan(p))
    m = len(indexed)
    adjusted = [float("nan")] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(indexed):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


SIMULATED = 3000  # samples per power estimate
EXACT_SIGNS = 4096  # every sign vector up to 12 pairs; beyond, this many drawn at random per estimate
SIMULATE_UP_TO = 200  # pairs; past this the exact test and the normal approximation agree to a few percent


def sign_flip_power(shift: float, pairs: int, level: float, samples: int = SIMULATED, seed: int = 0) -> float:
    """The power of the two-sided sign-flip test (:func:`sign_flip_p`, the test the report runs) at `level` when
    the paired differences are normal with mean `shift` standard deviations: simulated (the exact test is
    discrete, and at few pairs far from the normal approximation)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if 2 ** pairs <= EXACT_SIGNS:
        signs = ((np.arange(2 ** pairs)[:, None] >> np.arange(pairs)) & 1) * 2.0 - 1.0
    else:
        signs = rng.choice([-1.0, 1.0], size=(EXACT_SIGNS, pairs))
    diffs = rng.standard_normal((samples, pairs)) + shift
    observed = np.abs(diffs.mean(axis=1))
    extreme = (np.abs(diffs @ signs.T) / pairs >= observed[:, None] - 1e-12).sum(axis=1)
    p = extreme / len(signs) if 2 ** pairs <= EXACT_SIGNS else (extreme + 1) / (len(signs) + 1)
    return float((p <= level).mean())


def _normal_mdd(sd: float, pairs: int, level: float, power: float) -> float:
    z = NormalDist()
    return (z.inv_cdf(1 - level / 2) + z.inv_cdf(power)) * sd / math.sqrt(pairs)


def minimum_detectable(sd: float, pairs: int, comparisons: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true mean paired difference that the report's exact sign-flip test, at Holm's strictest level
    (alpha / m, two-sided), detects with the given power, for differences of standard deviation `sd`:
    simulated (at 11 pairs and m = 4 it is 1.24 SD; the normal approximation said 1.01). inf where no result
    is possible with so few pairs."""
    level = alpha / max(1, comparisons)
    if pairs < max(2, min_pairs_for(level)) or math.isnan(sd):
        return float("inf")
    if pairs > SIMULATE_UP_TO:
        return _normal_mdd(sd, pairs, level, power)
    low, high = 0.0, 2 * _normal_mdd(1.0, pairs, level, power) + 1.0
    if sign_flip_power(high, pairs, level) < power:
        return float("inf")
    for _ in range(14):  # the same samples at every shift: power rises with it, so bisection is exact enough
        middle = (low + high) / 2
        low, high = (low, middle) if sign_flip_power(middle, pairs, level) >= power else (middle, high)
    return high * sd


def pairs_needed(sd: float, difference: float, comparisons: int, alpha: float = 0.05, power: float = 0.8) -> int:
    """The fewest pairs with which the report's test detects `difference` (as :func:`minimum_detectable`)."""
    if difference <= 0 or math.isnan(sd):
        return 0
    level = alpha / max(1, comparisons)
    if sd == 0:
        return min_pairs_for(level)
    guess = max(2, math.ceil((_normal_mdd(sd, 1, level, power) / difference) ** 2))
    if guess > SIMULATE_UP_TO:
        return guess
    low = min_pairs_for(level)
    if sign_flip_power(difference / sd, low, level) >= power:
        return low
    high = min(max(low + 1, 2 * guess), SIMULATE_UP_TO)
    if sign_flip_power(difference / sd, high, level) < power:
        return max(guess, high)  # past what is simulated: the normal approximation's
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if sign_flip_power(difference / sd, middle, level) >= power else (middle, high)
    return high


def min_pairs_for(level: float) -> int:
    """The fewest pairs with which an exact two-sided sign-flip test can reach p <= level at all."""
    return math.ceil(math.log2(2 / level))
