"""What the measurement noise could and could not decide in a run: the shared figures (measure.py), whether any
two arms decided one kernel on different figures, the judge's own test-retest, and the runs that are not results.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping
from typing import Any

from kope_mcp.bench.agent import TaskRun
from kope_mcp.bench.config import SeedResult
from kope_mcp.bench.measure import Figure


def split_decisions(by_arm: Mapping[str, list[TaskRun]]) -> tuple[int, int, int]:
    """(kernels decided by two arms or more, pairs of arms that decided one kernel, those pairs whose figures
    differed). A kernel is its (seed, task, source, flags); the figure is what the arm decided on."""
    seen: dict[tuple[int, str], dict[str, float | None]] = {}
    for arm, runs in by_arm.items():
        for run in runs:
            for _, key, figure, _, _ in run.decisions:
                seen.setdefault((run.seed, str(key)), {})[arm] = figure
    shared = [figures for figures in seen.values() if len(figures) > 1]
    pairs = differing = 0
    for figures in shared:
        values = list(figures.values())
        for i in range(len(values)):
            for j in range(i + 1, len(values)):
                pairs += 1
                differing += values[i] != values[j]
    return len(shared), pairs, differing


def decisions_section(by_arm: Mapping[str, list[TaskRun]], measured: Mapping[str, Any]) -> list[str]:
    kernels, pairs, differing = split_decisions(by_arm)
    decided = sum(len(r.decisions) for runs in by_arm.values() for r in runs)
    lines = ["## One figure per kernel", ""]
    if not decided:
        return [*lines, "Every arm decided on its own profiles (no shared measurement in this run): the same "
                        "kernel can be kept by one arm and rejected by another on noise alone."]
    figures = [Figure(**f) for f in measured.values()]
    halves = [f.half_width for f in figures if f.speedup]
    profiles = [len(f.figures) for f in figures if f.speedup]
    lines += [f"Every arm kept or rejected a candidate on its kernel's shared figure (measure.py): "
              f"{len(measured)} distinct kernels measured once each for the whole run, "
              + (f"{statistics.median(profiles):.0f} profiles each (median), the interval's half-width a median "
                 f"{statistics.median(halves):.1%} (max {max(halves):.1%}); " if halves else "")
              + f"{decided} decisions. Kernels decided by two arms or more: {kernels}, in {pairs} pairs of arms; "
              f"**pairs decided on different figures: {differing}**."]
    return lines


def test_retest(results: list[SeedResult], measured: Mapping[str, Any] | None = None) -> list[str]:
    """The judge's figure of one kernel in one pass against the next: how far two measurements of the same
    kernel differ, which bounds what any single figure can decide; and the judge's median against the shared
    figure the arms decided on."""
    ratios: list[float] = []
    against: list[float] = []
    kernels = 0
    for result in results:
        for where, by_key in result.judge_passes.items():
            task_id = where.partition("@")[0]
            for key, passes in by_key.items():
                values = [v for v in passes if v]
                kernels += len(values) > 1
                ratios += [abs(math.log(a / b)) for a, b in itertools.pairwise(values)]
                shared = (measured or {}).get(f"{task_id}/{key}", {}).get("speedup")
                if values and shared:
                    against.append(abs(math.log(statistics.median(values) / shared)))
    if not ratios:
        return []
    lines = ["## Test-retest", "",
             f"The same kernel in consecutive passes of the judge ({kernels} kernels, {len(ratios)} pairs of passes, "
             f"each pass a short profile): {_spread(ratios)}."]
    if against:
        lines.append(f"The judge's median against the shared figure ({len(against)} kernels): {_spread(against)}. "
                     "Metrics read the shared figure.")
    return lines


def _spread(logs: list[float]) -> str:
    ordered = sorted(logs)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return (f"they differ by a median {math.exp(statistics.median(ordered)) - 1:.1%}, p90 {math.exp(p90) - 1:.1%}, "
            f"max {math.exp(ordered[-1]):.2f}x")


def not_results(by_arm: Mapping[str, list[TaskRun]], skipped: Mapping[str, str]) -> list[str]:
    failed = [r for runs in by_arm.values() for r in runs if r.error]
    if not failed and not skipped:
        return []
    lines = ["## Not results", ""]
    if skipped:
        lines += [f"Tasks the bench left out ({len(skipped)}): "
                  + "; ".join(f"`{t}`: {why}" for t, why in sorted(skipped.items())) + ".", ""]
    if failed:
        lines += [f"Runs that stopped on a failure ({len(failed)}; left out of every metric with their task's "
                  "other arms, and run again by `kope bench --resume DIR`):", "",
                  *(f"- seed {r.seed} `{r.policy}` on `{r.task_id}`: {r.error}" for r in failed)]
    return lines


def without_failures(by_arm: Mapping[str, list[TaskRun]]) -> dict[str, list[TaskRun]]:
    """The runs that are results: a (task, seed) where any arm failed is left out for every arm, so pairs stay
    pairs."""
    broken = {(r.task_id, r.seed) for runs in by_arm.values() for r in runs if r.error}
    return {arm: [r for r in runs if (r.task_id, r.seed) not in broken] for arm, runs in by_arm.items()}
