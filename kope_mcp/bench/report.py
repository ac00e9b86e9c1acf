"""Figures of an ablation run: per policy and seed, then mean and spread over seeds; markdown and PNG plots."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kope_mcp.bench.agent import TaskRun, arms
from kope_mcp.bench.analysis import aa_control, design_and_power, near_best, over_static, primary, verdict_counts
from kope_mcp.bench.config import SeedResult
from kope_mcp.bench.metrics import (
    area_under_best,
    attempts_to_near_best,
    best_known,
    failed_attempts,
    first_attempt_correct,
    paired,
    reach_at,
)
from kope_mcp.bench.noise import decisions_section, not_results, test_retest, without_failures


@dataclass
class PolicyFigures:
    pass_rate: float  # correct at the first attempt (every arm ends with a correct kernel: the naive one)
    geomean_speedup: float  # over the tasks every policy solved in this seed (the paper's intersection)
    attempts_to_correct: float
    context_tokens: int
    seconds: float


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(max(v, 1e-9)) for v in values)) if values else float("nan")


def seed_figures(result: SeedResult) -> tuple[dict[str, PolicyFigures], float, int]:
    """Figures per policy, the paired memory-on (active) vs memory-off (none) speedup, intersection size."""
    results_only = without_failures(result.runs)
    solved = [{r.task_id for r in runs if r.solved} for runs in results_only.values()]
    common = set.intersection(*solved) if solved else set()
    figures: dict[str, PolicyFigures] = {}
    for policy, runs in results_only.items():
        firsts = [r.first_correct for r in runs if r.first_correct is not None]
        figures[policy] = PolicyFigures(
            pass_rate=statistics.fmean(map(first_attempt_correct, runs)) if runs else float("nan"),
            geomean_speedup=geomean([r.final for r in runs if r.task_id in common]),
            attempts_to_correct=statistics.fmean(firsts) if firsts else float("nan"),
            context_tokens=sum(r.context_tokens for r in runs),
            seconds=sum(r.seconds for r in runs),
        )
    by_task = {p: {r.task_id: r.final for r in runs} for p, runs in results_only.items()}
    active = [arm for arm in by_task if arm.startswith("active")]
    # The widest window's active arm: the one least limited by the reader.
    arm = active[-1] if active else None
    ratio = geomean([by_task[arm][t] / by_task["none"][t] for t in common]) \
        if arm is not None and "none" in by_task else float("nan")
    return figures, ratio, len(common)


def _spread(values: list[float], fmt: str) -> str:
    clean = [v for v in values if not math.isnan(v)]
    if not clean:
        return "-"
    if len(clean) == 1:
        return format(clean[0], fmt)
    return f"{format(statistics.fmean(clean), fmt)} ± {format(statistics.stdev(clean), fmt)} " \
           f"({format(min(clean), fmt)}-{format(max(clean), fmt)})"


def curve(runs: list[TaskRun], budget: int) -> list[float]:
    """Geometric mean over tasks of the judged incumbent's speedup after each attempt (a finished run carries on)."""
    points = []
    for k in range(budget):
        values = [(r.curve[min(k, len(r.curve) - 1)] if r.curve else 1.0) for r in runs]
        points.append(geomean(values))
    return points


def catalogue_table(applies: dict[str, dict[str, int]], tasks_per_family: dict[str, int]) -> list[str]:
    """Markdown rows: per family, how many of its naive kernels each strategy fits (the per-family catalogue)."""
    names = sorted({name for counts in applies.values() for name in counts})
    lines = ["| family (tasks) | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for family in sorted(applies):
        lines.append(f"| {family} ({tasks_per_family[family]}) | "
                     + " | ".join(str(applies[family].get(n, 0) or "") for n in names) + " |")
    return lines


def markdown(results: list[SeedResult], budget: int, wall_s: float,
             catalogue: list[str] | None = None, policies: tuple[str, ...] = arms(),
             catalogue_best: dict[str, float] | None = None, measured: Mapping[str, Any] | None = None,
             skipped: Mapping[str, str] | None = None) -> str:
    per_seed = [seed_figures(r) for r in results]
    load = [x for r in results for runs in r.runs.values() for run in runs for x in run.load]
    every = [run for r in results for runs in r.runs.values() for run in runs]
    calls = sum(run.model_calls for run in every)
    agent = (f"a model behind an OpenAI-compatible endpoint ({calls:,} calls, "
             f"{sum(run.prompt_tokens for run in every):,} prompt tokens by its `usage`)" if calls else
             "the scripted agent (kope_mcp/bench/agent.py)")
    unfinished = sorted({size for r in results for size, by_arm in (r.sized_runs or {"all": r.runs}).items()
                         if any(len({run.task_id for run in runs}) < len(r.held_out) for arm, runs in by_arm.items()
                                if arm not in ("none", "oracle")) or not by_arm},
                        key=lambda size: (size == "all", int(size) if size.isdigit() else 0))
    lines = [f"# KOPE ablation on the CPU suite ({len(results)} seed(s), budget {budget} attempts per task)", "",
             f"Agent on the held-out tasks: {agent}; the warm-up and the catalogue are the scripted agent's. "
             + (f"**Partial run**: not every held-out task is finished from the memory of size "
                f"{', '.join(unfinished)} (`kope bench --resume DIR` goes on). " if unfinished else ""),
             "",
             f"Held-out tasks per seed: {len(results[0].held_out)}; warm-up tasks: {len(results[0].warmup)}; "
             f"wall time {wall_s / 60:.1f} min; 1-minute load average during attempts: median "
             f"{statistics.median(load) if load else 0:.2f}, max {max(load, default=0):.2f}.", "",
             *headline(results, budget, policies, catalogue_best or {}), "",
             *decisions_section(_by_arm(results), measured or {}), "", *test_retest(results, measured), "",
             *not_results(_by_arm(results, failures=True), skipped or {}), "",
             "## Speedups and tokens", "", "Mean ± standard deviation over seeds (min-max).", "",
             "| arm | correct at first attempt | geomean final speedup (judged, intersection) | attempts to first "
             "correct | context tokens read (total, real) | agent time (s) |", "| --- | --- | --- | --- | --- | --- |"]
    for policy in policies:
        figs = [f[0][policy] for f in per_seed if policy in f[0]]
        lines.append(f"| {policy} | {_spread([f.pass_rate for f in figs], '.0%')} | "
                     f"{_spread([f.geomean_speedup for f in figs], '.2f')} | "
                     f"{_spread([f.attempts_to_correct for f in figs], '.2f')} | "
                     f"{_spread([float(f.context_tokens) for f in figs], '.0f')} | "
                     f"{_spread([f.seconds for f in figs], '.0f')} |")
    paired_ratio = [p for _, p, _ in per_seed]
    sizes = [n for _, _, n in per_seed]
    lines += ["", f"Memory-on (active, widest window) vs memory-off (none), paired per task on the intersection "
              f"({_spread([float(n) for n in sizes], '.0f')} tasks): geomean ratio {_spread(paired_ratio, '.3f')}.",
              "", "Judged incumbent speedup vs attempt number (geomean over held-out tasks, first seed):", "",
              "| attempt | " + " | ".join(policies) + " |", "| --- |" + " --- |" * len(policies)]
    curves = {p: curve(without_failures(results[0].runs).get(p, []), budget) for p in policies}
    for k in range(budget):
        lines.append(f"| {k + 1} | " + " | ".join(f"{curves[p][k]:.2f}" for p in policies) + " |")
    if catalogue:
        lines += ["", "The catalogue per family: how many naive kernels of the family each strategy fits (a "
                  "strategy that does not fit a kernel's loop shape is never tried on it):", "", *catalogue]
    return "\n".join(lines) + "\n"


def _by_arm(results: list[SeedResult], size: str | None = None, failures: bool = False) -> dict[str, list[TaskRun]]:
    """Every arm's runs (of one memory size; None: the largest); without `failures`, only the results."""
    by_arm: dict[str, list[TaskRun]] = {}
    for result in results:
        source = result.runs if size is None else result.sized_runs.get(size, {})
        for arm, runs in source.items():
            by_arm.setdefault(arm, []).extend(runs)
    return by_arm if failures else without_failures(by_arm)


def _best(results: list[SeedResult], catalogue_best: dict[str, float]) -> dict[str, float]:
    """Per task: the catalogue's median best or the best any arm reached at any memory size, whichever is higher."""
    every = [r for res in results for by_arm in (res.sized_runs or {"all": res.runs}).values()
             for runs in by_arm.values() for r in runs]
    best = best_known(every)
    return {t: max(v, catalogue_best.get(t, 1.0)) for t, v in best.items()}


def headline(results: list[SeedResult], budget: int, policies: tuple[str, ...],
             catalogue_best: dict[str, float]) -> list[str]:
    """The curve over memory size per window first, then, on the largest memory, per arm: attempts to 90% of
    the best known (budgets 3 and full), reach@3, failures, area under best-so-far, first-attempt correct and
    real tokens; then, per window, active against passive, static, oracle and none, paired, with CIs."""
    best = _best(results, catalogue_best)
    by_arm = _by_arm(results)

    def to90(cap: int) -> Callable[[TaskRun], float]:
        return near_best(best, cap)

    lines = [*design_and_power(by_arm, policies, to90(budget)), "", *primary(by_arm, policies), "",
             *aa_control(by_arm, policies, to90(budget)), "", *over_static(by_arm, policies), "",
             "## Secondary: attempts until within 90% of the best known speedup (fewer is better)", "",
             "Best known per task: the measured catalogue's median best or the best judged incumbent of any arm, "
             "whichever is higher. A run that never got there counts budget + 1. Paired per (task, seed); 95% "
             "bootstrap CIs, not corrected (exploratory).", ""]
    sizes = list(results[0].sized_runs) if results and results[0].sized_runs else []
    if len(sizes) > 1:
        attempts = {size: statistics.fmean(r.memory_attempts.get(size, 0) for r in results) for size in sizes}
        sizes.sort(key=lambda size: attempts[size])
        lines += ["Against memory size (attempts in the memory each arm starts from; mean attempts to 90%, budget "
                  f"{budget}):", "", "| memory (attempts) | " + " | ".join(policies) + " |",
                  "| --- |" + " --- |" * len(policies)]
        for size in sizes:
            by_arm = _by_arm(results, size)
            cells = [f"{statistics.fmean(to90(budget)(r) for r in by_arm[a]):.2f}" if by_arm.get(a) else "-"
                     for a in policies]
            lines.append(f"| {size} ({attempts[size]:,.0f}) | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["| arm | attempts to 90% (budget 3) | attempts to 90% (budget " f"{budget}) | reach@3 | failed "
              "attempts / task | area under the judged curve (log) | correct at first attempt | real tokens read / "
              "task | peak transcript tokens |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for arm in policies:
        runs = by_arm.get(arm, [])
        if not runs:
            continue
        lines.append(f"| {arm} | {statistics.fmean(map(to90(3), runs)):.2f} | "
                     f"{statistics.fmean(map(to90(budget), runs)):.2f} | "
                     f"{statistics.fmean(reach_at(r, best[r.task_id], 3) for r in runs):.0%} | "
                     f"{statistics.fmean(failed_attempts(r) for r in runs):.2f} | "
                     f"{statistics.fmean(area_under_best(r) for r in runs):.3f} | "
                     f"{statistics.fmean(first_attempt_correct(r) for r in runs):.0%} | "
                     f"{statistics.fmean(r.context_tokens for r in runs):,.0f} | "
                     f"{max(r.peak_tokens for r in runs):,} |")
    verdicts: dict[str, list[str]] = {}
    lines += ["", "| window | active vs | difference in attempts to 90% (95% CI) | pairs | active ... |",
              "| --- | --- | --- | --- | --- |"]
    for arm in policies:
        if not arm.startswith("active@"):
            continue
        window = arm.partition("@")[2]
        for other in (f"passive@{window}", "static", "oracle", "none"):
            if other not in by_arm:
                continue
            cmp = paired(by_arm, arm, other, to90(budget))
            lines.append(f"| {window} | {other} | {cmp.mean:+.2f} ({cmp.low:+.2f} to {cmp.high:+.2f}) | "
                         f"{cmp.pairs} | {cmp.verdict()} {other} |")
            verdicts.setdefault(window, []).append(f"{cmp.verdict()} {other}")
    said = "; ".join(f"at {w}, active {', '.join(v)}" for w, v in verdicts.items())
    lines += ["", "In words (a CI that contains 0 shows no difference, which is not evidence that there is none): "
              + said + ".", "", *verdict_counts(by_arm, policies)]
    return lines


def plots(results: list[SeedResult], budget: int, out: Path, policies: tuple[str, ...] = arms()) -> list[Path]:
    """first_correct.png, speedup.png (mean with the seeds' standard deviation) and curve.png; one colour per
    arm, the same in every figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_seed = [seed_figures(r)[0] for r in results]
    written = []
    colours = arm_colours(policies)
    for name, attr, label in (("first_correct", "pass_rate", "correct at the first attempt"),
                              ("speedup", "geomean_speedup", "geomean final speedup (judged)")):
        means, errs = [], []
        for policy in policies:
            values = [getattr(f[policy], attr) for f in per_seed if policy in f]
            values = [v for v in values if not math.isnan(v)] or [0.0]
            means.append(statistics.fmean(values))
            errs.append(statistics.stdev(values) if len(values) > 1 else 0.0)
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.bar(policies, means, yerr=errs, capsize=6, color=[colours[p] for p in policies])
        ax.tick_params(axis="x", labelrotation=45)
        ax.set_ylabel(label)
        ax.set_title(f"{label} per policy ({len(results)} seed(s))")
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    sizes = list(results[0].sized_runs) if results and results[0].sized_runs else []
    if len(sizes) > 1:
        sizes.sort(key=lambda size: statistics.fmean(r.memory_attempts.get(size, 0) for r in results))
        written.append(_memory_curve(results, budget, out, policies, sizes))
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for policy in policies:
        series = [curve(without_failures(r.runs).get(policy, []), budget) for r in results]
        mean = [statistics.fmean(s[k] for s in series) for k in range(budget)]
        ax.plot(range(1, budget + 1), mean, marker="o", label=policy, color=colours[policy])
    ax.set_xlabel("attempt")
    ax.set_ylabel("judged incumbent speedup (geomean)")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    path = out / "curve.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)
    return written


def arm_colours(policies: tuple[str, ...]) -> dict[str, tuple[float, float, float, float]]:
    """A distinct colour per arm (tab20 has 20; more arms than that cycle)."""
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    return {arm: cmap(i % 20) for i, arm in enumerate(policies)}


def _memory_curve(results: list[SeedResult], budget: int, out: Path, policies: tuple[str, ...],
                  sizes: list[str]) -> Path:
    """memory_curve.png: per window, mean attempts to 90% of the best known against memory size."""
    import matplotlib.pyplot as plt

    best = _best(results, {})
    windows = [a.partition("@")[2] for a in policies if a.startswith("active@")] or [""]
    fig, axes = plt.subplots(1, len(windows), figsize=(4 * len(windows), 3.5), squeeze=False, sharey=True)
    xs = [statistics.fmean(r.memory_attempts.get(size, 0) for r in results) for size in sizes]
    for ax, window in zip(axes[0], windows, strict=True):
        for arm in ("none", "static", "oracle", f"passive@{window}", f"active@{window}"):
            if arm not in policies:
                continue
            ys = []
            for size in sizes:
                runs = _by_arm(results, size).get(arm, [])
                ys.append(statistics.fmean(min(attempts_to_near_best(r, best[r.task_id]), budget + 1)
                                           for r in runs) if runs else float("nan"))
            ax.plot(xs, ys, marker="o", label=arm.partition("@")[0], color=arm_colours(policies)[arm])
        ax.set_xscale("log")
        ax.set_title(f"window {window}" if window else "")
        ax.set_xlabel("attempts in the memory")
    axes[0][0].set_ylabel("attempts to 90% of best (mean)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    path = out / "memory_curve.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
