"""The pre-registered analysis of an ablation run (docs/ablation.md): the design and its power first, then the
primary comparison with Holm's correction, the secondary metric, the A/A control and the verdicts each arm met.

Pre-registered: the primary metric is the area under the log of the judged incumbent curve (metrics.py); the
primary family is active@W against passive@W at every window W, each a two-sided sign-flip test on the paired
(task, seed) differences, Holm-corrected over the windows at alpha 0.05. The smallest effect of interest is
0.095 in that area (a geomean incumbent 10% faster over the whole budget). Everything else is secondary and
reported with bootstrap CIs only.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from kope_mcp.bench.agent import TaskRun
from kope_mcp.bench.metrics import (
    area_under_best,
    attempts_to_near_best,
    bootstrap_interval,
    holm,
    min_pairs_for,
    minimum_detectable,
    paired,
    paired_differences,
    pairs_needed,
    sign_flip_p,
)

ALPHA = 0.05
POWER = 0.8
EFFECT_OF_INTEREST = math.log(1.1)  # the primary metric's smallest difference worth detecting
AA_MIN_PAIRS = 5  # below this a bootstrap CI is too coarse to call the A/A either way
ATTEMPTS_OF_INTEREST = 1.0  # the secondary metric's


def min_pairs(comparisons: int) -> int:
    """The fewest pairs with which a two-sided exact sign-flip test can reach alpha / comparisons."""
    return min_pairs_for(ALPHA / max(1, comparisons))


def windows_of(policies: tuple[str, ...]) -> list[str]:
    return [arm.partition("@")[2] for arm in policies if arm.startswith("active@")]


def design_and_power(by_arm: dict[str, list[TaskRun]], policies: tuple[str, ...],
                     to90: Callable[[TaskRun], float]) -> list[str]:
    """What the run can detect, stated before any result: pairs per window, the paired SD observed, the
    minimum detectable difference at 80% power under Holm's strictest level, and the pairs a 10% effect needs."""
    windows = windows_of(policies)
    m = len(windows)
    lines = ["## Design and power (read this first)", "",
             f"Primary: area under the log of the judged incumbent curve, active@W vs passive@W at {m} window(s), "
             f"sign-flip tests, Holm-corrected at alpha {ALPHA}; smallest effect of interest {EFFECT_OF_INTEREST:.3f} "
             "(a geomean incumbent 10% faster over the budget). Secondary: attempts to 90% of the best known "
             f"(effect of interest {ATTEMPTS_OF_INTEREST:.0f} attempt). The SDs below are this run's own.", "",
             f"An exact sign-flip test cannot give p below 2 / 2^n: under Holm's strictest level "
             f"({ALPHA} / {m}) no result is possible with fewer than {min_pairs(m)} pairs, whatever the effect.", "",
             "Minimum detectable differences and pairs needed are simulated for that exact test (normal "
             "differences of the SD observed), not taken from a normal approximation, which is optimistic at few "
             "pairs.", "",
             "| window | pairs | SD of paired differences (primary) | minimum detectable (80% power) | pairs needed "
             "for 0.095 | SD (attempts to 90%) | minimum detectable (attempts) | pairs needed for 1 attempt |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for window in windows:
        a, b = f"active@{window}", f"passive@{window}"
        primary = paired_differences(by_arm, a, b, area_under_best)
        secondary = paired_differences(by_arm, a, b, to90)
        n = len(primary)
        sd1 = statistics.stdev(primary) if n > 1 else float("nan")
        sd2 = statistics.stdev(secondary) if n > 1 else float("nan")
        if n < 2:
            lines.append(f"| {window} | {n} | - | not estimable (fewer than 2 pairs) | - | - | - | - |")
            continue
        lines.append(f"| {window} | {n} | {sd1:.3f} | {minimum_detectable(sd1, n, m, ALPHA, POWER):.3f} | "
                     f"{pairs_needed(sd1, EFFECT_OF_INTEREST, m, ALPHA, POWER) or '-'} | {sd2:.2f} | "
                     f"{minimum_detectable(sd2, n, m, ALPHA, POWER):.2f} | "
                     f"{pairs_needed(sd2, ATTEMPTS_OF_INTEREST, m, ALPHA, POWER) or '-'} |")
    return lines


def primary(by_arm: dict[str, list[TaskRun]], policies: tuple[str, ...]) -> list[str]:
    windows = windows_of(policies)
    rows = []
    for window in windows:
        a, b = f"active@{window}", f"passive@{window}"
        diffs = paired_differences(by_arm, a, b, area_under_best)
        rows.append((window, paired(by_arm, a, b, area_under_best), sign_flip_p(diffs)))
    adjusted = holm([p for _, _, p in rows])
    lines = ["## Primary: active vs passive, area under the log judged incumbent curve (higher is better)", "",
             "| window | active − passive (95% bootstrap CI) | pairs | p (sign-flip) | p (Holm) | at alpha 0.05 |",
             "| --- | --- | --- | --- | --- | --- |"]
    for (window, cmp, p), p_holm in zip(rows, adjusted, strict=True):
        said = "no pairs" if cmp.pairs == 0 else ("active better" if p_holm < ALPHA and cmp.mean > 0 else
                                                  "passive better" if p_holm < ALPHA else "no difference shown")
        lines.append(f"| {window} | {cmp.mean:+.3f} ({cmp.low:+.3f} to {cmp.high:+.3f}) | {cmp.pairs} | {p:.3f} | "
                     f"{p_holm:.3f} | {said} |")
    return lines


def over_static(by_arm: dict[str, list[TaskRun]], policies: tuple[str, ...]) -> list[str]:
    """What a strategy order gives (static against none) apart from what selection or the whole history adds on
    top of it (each memory arm against static): static holds the memory's ~100-token global order and nothing
    else, so a claim for reading the memory is a claim against static."""
    rows = [("static", "none")] + [(arm, "static") for arm in policies
                                   if arm.partition("@")[0] in ("active", "passive") and arm in by_arm]
    lines = ["## The order and the reading: against none, and against static", "",
             "Static reads only the memory's global strategy order; `static - none` is what that order gives, and "
             "each memory arm against static is what reading the memory adds on top of it. Sign-flip p, "
             "uncorrected (the pre-registered comparison is the primary above).", "",
             "| comparison | difference in the primary metric (95% CI) | pairs | p (sign-flip) |",
             "| --- | --- | --- | --- |"]
    for a, b in rows:
        if a not in by_arm or b not in by_arm:
            continue
        cmp = paired(by_arm, a, b, area_under_best)
        p = sign_flip_p(paired_differences(by_arm, a, b, area_under_best))
        lines.append(f"| {a} - {b} | {cmp.mean:+.3f} ({cmp.low:+.3f} to {cmp.high:+.3f}) | {cmp.pairs} | {p:.3f} |")
    return lines


AA_SD_GOAL = 0.05  # the A/A's paired SD on the primary metric that leaves the effect of interest visible


def aa_control(by_arm: dict[str, list[TaskRun]], policies: tuple[str, ...],
               to90: Callable[[TaskRun], float]) -> list[str]:
    """The A/A arm (passive's reads, static's choices) against static: its paired SD on the primary metric, and
    an equivalence test (two one-sided, as a 90% bootstrap CI inside +-the effect of interest): a CI that contains
    0 is not evidence of a tie; one inside the margin is."""
    aa = next((arm for arm in policies if arm.startswith("aa@")), None)
    if aa is None or aa not in by_arm or "static" not in by_arm:
        return []
    diffs = paired_differences(by_arm, aa, "static", area_under_best)
    auc = paired(by_arm, aa, "static", area_under_best)
    att = paired(by_arm, aa, "static", to90)
    low, high = bootstrap_interval(diffs, 0.90)
    equivalent = low > -EFFECT_OF_INTEREST and high < EFFECT_OF_INTEREST
    sd = statistics.stdev(diffs) if len(diffs) > 1 else float("nan")
    same = sum(r.strategies == s.strategies for r in by_arm[aa] for s in by_arm["static"]
               if (r.task_id, r.seed) == (s.task_id, s.seed))
    verdict = (f"**Too few pairs to judge** (fewer than {AA_MIN_PAIRS})." if auc.pairs < AA_MIN_PAIRS else
               f"**Equivalent to static** within +-{EFFECT_OF_INTEREST:.3f} (the 90% CI lies inside the margin)."
               if equivalent else
               "**Not shown equivalent to static**: the protocol's noise or a bias between arms is as large as "
               "the effect of interest; read every comparison with that in mind.")
    return ["## A/A control", "",
            f"`{aa}` reads what passive reads and chooses what static chooses. Against `static`: primary "
            f"{auc.mean:+.3f} (95% CI {auc.low:+.3f} to {auc.high:+.3f}; 90% CI {low:+.3f} to {high:+.3f}), "
            + (f"**paired SD {sd:.3f}**" if len(diffs) > 1 else "paired SD not estimable (one pair)")
            + f" (goal <= {AA_SD_GOAL}), attempts to 90% {att.mean:+.2f} ({att.low:+.2f} to "
            f"{att.high:+.2f}), {auc.pairs} pairs; the same strategies in the same order in {same} of {auc.pairs}. "
            + verdict]


def verdict_counts(by_arm: dict[str, list[TaskRun]], policies: tuple[str, ...]) -> list[str]:
    lines = ["## Verdicts met per arm", "",
             "Profiles the server flagged (a suspect or noisy result never replaces the incumbent; an unverified "
             "timing measures nothing). Suspect includes a speedup whose CI contains 1: no measurable change from "
             "the naive baseline, the commonest reason.", "",
             "| arm | profiles | suspect | noisy | timing unverified |", "| --- | --- | --- | --- | --- |"]
    for arm in policies:
        runs = by_arm.get(arm, [])
        if not runs:
            continue
        profiled = sum(r.outcomes.get("correct", 0) + r.outcomes.get("faster", 0) for r in runs)
        counts = {k: sum(r.verdicts.get(k, 0) for r in runs) for k in ("suspect", "noisy", "timing_unverified")}
        lines.append(f"| {arm} | {profiled} | {counts['suspect']} | {counts['noisy']} | "
                     f"{counts['timing_unverified']} |")
    return lines


def near_best(best: dict[str, float], cap: int) -> Callable[[TaskRun], float]:
    return lambda r: float(min(attempts_to_near_best(r, best[r.task_id]), cap + 1))
