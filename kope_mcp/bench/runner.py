"""`kope bench`: run the ablation protocol, then write report.md, results.json and PNG plots."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from kope_mcp.bench.agent import run_task
from kope_mcp.bench.candidates import applicable
from kope_mcp.bench.catalogue import best_from_catalogue, measure_catalogue
from kope_mcp.bench.config import (
    QUICK_FAMILIES,
    BenchConfig,
    SeedResult,
    one_core_warmup_tasks,
    plan,
    save_config,
)
from kope_mcp.bench.cost import BudgetSpent, Estimate, Meter, estimate
from kope_mcp.bench.protocol import MEASURED, MEMORYLESS, AgentFn, from_json, run_seed, to_json
from kope_mcp.bench.report import catalogue_table, markdown, plots
from kope_mcp.tasks.registry import TaskRegistry


def full_config(out: Path, registry: TaskRegistry | None = None) -> BenchConfig:
    """`kope bench`: sized to finish in about two hours on a 2-core machine. Every family, one held-out task
    each (the one whose profiling size moves the fewest bytes: profiling dominates the run); the warm-up tries
    every strategy on two tasks per family of the other half here, and on one per family pinned to one core
    (another hardware key), so the memory (~350 attempts, ~45k tokens of history) outgrows the small windows;
    the curve at four sizes (samples of 40, 80 and 160 attempts, and all of it) with static and the 8k arms."""
    tasks = (registry or TaskRegistry.default()).list()
    footprints = {t.id: float(t.spec.byte_count(t.spec.profile.sizes)) for t in tasks}
    return BenchConfig(out=out, seeds=1, budget=8, held_per_family=1, warm_budget=14, one_core_warmup=True,
                       warm_per_family=2, one_core_per_family=1, memory_sizes=(40, 80, 160),
                       sized_windows=(8_000,), profile_s=0.1, footprints=footprints)


def quick_config(out: Path) -> BenchConfig:
    """CI-sized: three families, one warm-up and one held-out task each, one seed, 4 attempts."""
    return BenchConfig(out=out, seeds=1, budget=4, families=QUICK_FAMILIES, per_family=1, profile_s=0.1,
                       windows=(8_000,), catalogue_repeats=1)


class BarProgress:
    """One bar over every task run of the benchmark (warm-up and each policy), a line per finished task above it.
    Without a terminal (CI logs) the bar is off and only the lines are printed."""

    def __init__(self, total: int) -> None:
        from tqdm import tqdm

        self._write = tqdm.write
        self._bar = tqdm(total=total, unit="task", file=sys.stderr, disable=None, dynamic_ncols=True,
                         bar_format="{desc} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} tasks "
                                    "[{elapsed}<{remaining}]")

    def started(self, label: str, task_id: str) -> None:
        self._bar.set_description_str(f"{label}: {task_id}")

    def finished(self, line: str) -> None:
        self.note(line)
        self._bar.update(1)

    def note(self, line: str) -> None:
        self._write(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr)

    def close(self) -> None:
        self._bar.close()


def _catalogue(registry: TaskRegistry, config: BenchConfig) -> list[str]:
    applies: dict[str, Counter[str]] = {}
    sizes: Counter[str] = Counter()
    for task in registry.list():
        if config.families is None or task.spec.family in config.families:
            sizes[task.spec.family] += 1
            applies.setdefault(task.spec.family, Counter()).update(applicable(task.baseline_source or ""))
    return catalogue_table({f: dict(c) for f, c in applies.items()}, dict(sizes))


SKIPPED = "skipped.json"  # task -> why the bench cannot use it


def benchable(registry: TaskRegistry) -> tuple[dict[str, str], dict[str, str]]:
    """({task_id: family} the scripted agent can work, {task_id: why not} for the rest). Its strategies rewrite
    a C kernel, so a task needs a naive C baseline to start from (a KernelBench problem imported without one has
    only its PyTorch reference); a task left out is named in the report, never a failure of the run."""
    tasks: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for task in registry.list():
        if not (task.baseline_source or "").strip():
            skipped[task.id] = "no naive C baseline to start from (an imported problem's reference is PyTorch)"
        else:
            tasks[task.id] = task.spec.family
    return tasks, skipped


def planned_estimate(config: BenchConfig, context_window: int) -> Estimate:
    """The model's prompt tokens for this configuration (cost.py), over every seed's split."""
    tasks, _ = benchable(TaskRegistry.default())
    splits = [plan(config, tasks, seed) for seed in range(config.seeds)]
    warm, _ = splits[0]
    one_core = len(one_core_warmup_tasks(config, tasks, warm)) if config.one_core_warmup else 0
    return estimate(config, len(warm), one_core, sum(len(h) for _, h in splits), context_window)


def task_runs(config: BenchConfig, tasks: Mapping[str, str], warm: list[str], held: list[str]) -> int:
    """Task runs of one seed: the warm-up passes (here and on one core), then every arm per memory size, `none`
    and `oracle` once."""
    one_core = len(one_core_warmup_tasks(config, tasks, warm)) if config.one_core_warmup else 0
    per_task = len(config.arms) + sum(sum(a not in MEMORYLESS for a in config.arms_at(str(n)))
                                      for n in config.memory_sizes)
    return (len(warm) + one_core) * config.warm_passes + len(held) * per_task


async def run_bench(config: BenchConfig, resume: bool = False, agent: AgentFn | None = None) -> Path:
    """Run every seed; returns the report's path (plots next to it). With `resume`, `config.out` holds a stopped
    run (its bench-config.json, results.json and seed folders): what it finished is kept and the run goes on."""
    config.out.mkdir(parents=True, exist_ok=True)
    registry = TaskRegistry.default()
    tasks, skipped = benchable(registry)
    (config.out / SKIPPED).write_text(json.dumps(skipped, indent=1))
    started = time.monotonic()
    results: list[SeedResult] = []
    previous: dict[int, SeedResult] = {}
    wall_path = config.out / "wall_seconds"
    prior_wall = 0.0
    if resume:
        if (config.out / "results.json").exists():
            previous = {r.seed: r for r in from_json(json.loads((config.out / "results.json").read_text()))}
        prior_wall = float(wall_path.read_text()) if wall_path.exists() else 0.0
    else:
        save_config(config)

    def save(partial: SeedResult) -> None:
        (config.out / "results.json").write_text(json.dumps(to_json([*results, partial]), indent=1))
        wall_path.write_text(f"{prior_wall + time.monotonic() - started:.0f}\n")

    splits = [plan(config, tasks, seed) for seed in range(config.seeds)]
    held_out = sorted({t for _, held in splits for t in held})
    progress = BarProgress(len(held_out) + sum(task_runs(config, tasks, warm, held) for warm, held in splits))
    for task_id, reason in skipped.items():
        progress.note(f"skipped {task_id}: {reason}")
    meter = Meter(config.max_tokens, sum(r.prompt_tokens + r.completion_tokens for s in previous.values()
                                         for by_arm in s.sized_runs.values() for runs in by_arm.values()
                                         for r in runs))
    try:
        # The oracle's order and the floor of the best known speedups: measured first, on the held-out tasks.
        catalogue = await measure_catalogue(config, held_out, progress, config.catalogue_repeats)
        for seed in range(config.seeds):
            results.append(await run_seed(config, tasks, seed, progress, catalogue, save, previous.get(seed),
                                          agent or run_task, meter))
    except BudgetSpent as spent:
        progress.note(str(spent))
    finally:
        progress.close()
    wall_path.write_text(f"{prior_wall + time.monotonic() - started:.0f}\n")
    return write_report(config, registry)


def write_report(config: BenchConfig, registry: TaskRegistry | None = None) -> Path:
    """report.md and the plots from the folder's results.json and catalogue.json (`kope bench --report DIR`
    re-renders them, for a run that was stopped or to change the report)."""
    results = from_json(json.loads((config.out / "results.json").read_text()))
    catalogue_path = config.out / "catalogue.json"
    catalogue = json.loads(catalogue_path.read_text()) if catalogue_path.exists() else {}
    wall_path = config.out / "wall_seconds"
    wall = float(wall_path.read_text()) if wall_path.exists() else float("nan")
    arms = tuple(dict.fromkeys(arm for r in results for arm in r.runs)) or config.arms
    budget = next((run.budget for r in results for runs in r.runs.values() for run in runs), config.budget)
    report = config.out / "report.md"
    measured_path, skipped_path = config.out / MEASURED, config.out / SKIPPED
    text = markdown(results, budget, wall, _catalogue(registry or TaskRegistry.default(), config), arms,
                    best_from_catalogue(catalogue),
                    json.loads(measured_path.read_text()) if measured_path.exists() else {},
                    json.loads(skipped_path.read_text()) if skipped_path.exists() else {})
    images = plots(results, budget, config.out, arms)
    report.write_text(text + "\n" + "\n".join(f"![{p.stem}]({p.name})" for p in images) + "\n")
    return report
