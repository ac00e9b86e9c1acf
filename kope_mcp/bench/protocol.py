"""The ablation protocol: warm a memory on some tasks, then run every arm on held-out tasks from copies of
that same memory, for several seeds and, optionally, several memory sizes.

Split (documented, seeded): within each family the task ids are shuffled with the seed; the first half
(rounded up) warms the memory, the rest are held out, so every family is represented on both sides. The warm-up
runs the `none` policy (it explores in random order, so the memory holds wins and failures of every strategy),
`warm_passes` times; exports of other hardware's experience can be imported on top (`imports`). For each memory
size (a seeded family-stratified sample of N attempts of that memory; all of it by default) every arm works
every held-out task from its own fresh copy, so no arm sees another's held-out experience, nor its own from an
earlier held-out task: the (task, seed) pairs are independent. Arms are interleaved per task (each task is
worked by every arm, in an order rotated from task to task, before the next task starts), so a slow spell of
the machine falls on all arms alike; the load average is logged with every attempt. Every agent talks to a real
`kope serve` over stdio (owning its home, --no-daemon). After each task a judge re-profiles every arm's
incumbents in one interleaved pass (judge.py), and a stopped run resumes at the first unfinished task.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from mcp import Client
from mcp.types import Implementation

from kope_mcp.bench.agent import TaskRun, parse_arm, read_history, run_task, static_order
from kope_mcp.bench.catalogue import Catalogue, oracle_order
from kope_mcp.bench.config import (
    MEMORYLESS,
    BenchConfig,
    Progress,
    SeedResult,
    one_core_warmup_tasks,
    plan,
    server_params,
)
from kope_mcp.bench.cost import Meter
from kope_mcp.bench.judge import judge_task, judged_curve
from kope_mcp.bench.measure import MeasureConfig, SharedMeasure
from kope_mcp.bench.memories import attempts_in, kope_memory, subsample_export

MEASURED = "measured.json"  # the run's shared figures (measure.py)


class AgentFn(Protocol):
    """Who works a held-out task (agent.run_task, or llm_episode.llm_agent's model): the warm-up and the catalogue
    are always the scripted agent's, so both agents start from the same memory."""

    async def __call__(self, client: Client, task_id: str, arm: str, budget: int, seed: int,
                       ranking: list[str] | None = None, measure: SharedMeasure | None = None) -> TaskRun: ...


def _line(label: str, i: int, n: int, run: TaskRun) -> str:
    return (f"{label:<22} [{i:>2}/{n}] {run.task_id:<22} {'solved' if run.solved else 'FAILED':<6} best "
            f"{run.best_speedup:6.2f}x  attempts {run.attempts}  read {run.context_tokens} tok  {run.seconds:5.1f} s")


async def run_tasks(home: Path, config: BenchConfig, policy: str, task_ids: list[str], seed: int,
                    progress: Progress, label: str | None = None, budget: int | None = None,
                    pin_one_core: bool = False) -> list[TaskRun]:
    """One arm over several tasks through one server (the warm-up, the LLM bench's memory)."""
    runs: list[TaskRun] = []
    label = label or f"seed {seed} {policy}"
    client_info = Implementation(name=f"bench-{policy}", version="1")
    async with Client(server_params(home, config, pin_one_core), client_info=client_info) as c:
        for i, task_id in enumerate(task_ids, 1):
            progress.started(label, task_id)
            run = await run_task(c, task_id, policy, budget or config.budget, seed)
            runs.append(run)
            progress.finished(_line(label, i, len(task_ids), run))
    return runs


async def warm_memory(config: BenchConfig, warm: list[str], seed: int, home: Path, progress: Progress,
                      one_core: list[str] | None = None) -> None:
    for p in range(config.warm_passes):
        label = f"seed {seed} warm-up" + (f" {p + 1}/{config.warm_passes}" if config.warm_passes > 1 else "")
        await run_tasks(home, config, "none", warm, seed + 10_000 + 1000 * p, progress, label,
                        budget=config.warm_budget)
    imports = list(config.imports)
    if config.one_core_warmup:
        # The same warm-up on "other hardware": one core, so OpenMP wins shrink and the key ends in /1c.
        other = home.parent / "warm-1c"
        for p in range(config.warm_passes):
            await run_tasks(other, config, "none", warm if one_core is None else one_core,
                            seed + 20_000 + 1000 * p, progress,
                            f"seed {seed} warm-up 1c", budget=config.warm_budget, pin_one_core=True)
        imports.append(home.parent / "warm-1c.jsonl")
        kope_memory(other, "export", imports[-1])
    for export in imports:
        progress.note(f"seed {seed}: importing {export}: {kope_memory(home, 'import', export)}")


async def run_seed(config: BenchConfig, tasks: Mapping[str, str], seed: int, progress: Progress,
                   catalogue: Catalogue | None = None, save: Callable[[SeedResult], None] | None = None,
                   previous: SeedResult | None = None, agent: AgentFn = run_task,
                   meter: Meter | None = None) -> SeedResult:
    """One seed; `save` is called with the partial result after every held-out task. With `previous` (the
    seed's partial result of a stopped run) a finished warm-up and finished tasks are kept, and the run goes on
    at the first task not finished by every arm."""
    warm, held = plan(config, tasks, seed)
    root = config.out / f"seed-{seed}"
    warm_home = root / "warm"
    warmed = root / "warm.done"
    if previous is not None and warmed.exists():
        result = previous
        progress.note(f"seed {seed}: resuming ({sum(len(r) for by in result.sized_runs.values() for r in by.values())}"
                      " task runs kept)")
    else:
        if root.exists():
            shutil.rmtree(root)  # a warm-up stopped midway is not a memory: it starts again
        result = SeedResult(seed=seed, warmup=warm, held_out=held)
        started = time.monotonic()
        progress.note(f"seed {seed}: warming the memory on {len(warm)} tasks, {len(held)} held out")
        await warm_memory(config, warm, seed, warm_home, progress, one_core_warmup_tasks(config, tasks, warm))
        result.warmup_seconds = time.monotonic() - started
        result.static_order = await _static_order(warm_home, config)
        warmed.write_text(f"{result.warmup_seconds:.0f}\n")
    homes = _sized_homes(config, root, warm_home, seed)
    # smallest first, whatever order they run in
    result.sized_runs = {size: result.sized_runs.get(size, {}) for size, _ in homes}
    memoryless: dict[str, list[TaskRun]] = {}
    for n, (size, home) in enumerate(reversed(homes)):
        result.memory_attempts[size] = attempts_in(home / "memory-export.jsonl")
        progress.note(f"seed {seed}: memory '{size}' holds {result.memory_attempts[size]} attempts")
        # `none` and `oracle` read no memory: they run once, on the largest, and count for every size.
        arms = [a for a in config.arms_at(size) if n == 0 or a not in MEMORYLESS]
        # The static order is the global order of the memory the arms start from, whatever its size.
        static = result.static_order if size == "all" else await _static_order(home, config)

        def keep(runs: dict[str, list[TaskRun]], size: str = size,
                 memoryless: dict[str, list[TaskRun]] = memoryless) -> None:
            result.sized_runs[size] = {**runs, **(memoryless if size != "all" else {})}
            result.runs = result.sized_runs.get("all", {})
            if save is not None:
                save(result)

        await _interleaved(config, home, root / f"arms-{size}", held, seed, progress, arms, static, catalogue,
                           size, result.sized_runs[size], keep, agent, result.judge_passes, meter)
        if n == 0:
            memoryless = {a: r for a, r in result.sized_runs[size].items() if a in MEMORYLESS}
        keep({a: r for a, r in result.sized_runs[size].items() if a in arms})
    result.runs = result.sized_runs["all"]
    return result


def _sized_homes(config: BenchConfig, root: Path, warm_home: Path, seed: int) -> list[tuple[str, Path]]:
    """(label, home) per memory size, smallest first; each home also holds its export (memory-export.jsonl).
    Made once per seed (`sizes.done`), so a resumed run reads the same memories."""
    full = root / "memory-full.jsonl"
    made = root / "sizes.done"
    if not made.exists():
        kope_memory(warm_home, "export", full)
    total = attempts_in(full)
    sizes = sorted({n for n in config.memory_sizes if n < total})
    homes = []
    for n in sizes:
        home = root / f"memory-{n}"
        if not made.exists():
            shutil.rmtree(home, ignore_errors=True)
            home.mkdir(parents=True)
            subsample_export(full, home / "memory-export.jsonl", n, seed)
            kope_memory(home, "import", home / "memory-export.jsonl")
        homes.append((str(n), home))
    if not made.exists():
        shutil.copy(full, warm_home / "memory-export.jsonl")
        made.write_text("")
    homes.append(("all", warm_home))
    return homes


async def _interleaved(config: BenchConfig, memory_home: Path, arms_root: Path, held: list[str], seed: int,
                       progress: Progress, arms: list[str], static: list[str], catalogue: Catalogue | None,
                       size: str, existing: dict[str, list[TaskRun]],
                       keep: Callable[[dict[str, list[TaskRun]]], None], agent: AgentFn = run_task,
                       passes: dict[str, dict[str, list[float | None]]] | None = None,
                       meter: Meter | None = None) -> None:
    """Every arm works every held-out task, each (arm, task) from its own fresh copy of the memory: pairs are
    independent (no arm carries one held-out task's experience into the next), and a stopped run goes on at the
    first task some arm did not finish. `keep` gets the runs after every finished task. A task an arm could not
    finish (a tool failed) is noted as not a result and the bench goes on; a resumed run works it again."""
    passes = {} if passes is None else passes
    arms = [a for a in arms if a != "oracle" or catalogue is not None]
    done = {t for t in held
            if all(any(r.task_id == t and not r.error for r in existing.get(a, [])) for a in arms)}
    runs: dict[str, list[TaskRun]] = {a: [r for r in existing.get(a, []) if r.task_id in done] for a in arms}
    if len(done) == len(held):
        return
    async with Client(server_params(arms_root / "judge", config),
                      client_info=Implementation(name="bench-judge", version="1")) as judge, \
            _shared_measure(config) as measure:
        for i, task_id in enumerate(held):
            if task_id in done:
                continue
            rotated = arms[i % len(arms):] + arms[:i % len(arms)]
            for arm in rotated:
                label = f"seed {seed} {arm}" + (f" [{size}]" if size != "all" else "")
                if meter is not None:
                    meter.check()  # BudgetSpent: the run stops between tasks, what finished is kept
                progress.started(label, task_id)
                policy, _ = parse_arm(arm)
                ranking = static if policy in ("static", "aa") else \
                    oracle_order(catalogue, task_id) if policy == "oracle" and catalogue is not None else None
                home = arms_root / arm.replace("@", "-") / task_id
                shutil.rmtree(home, ignore_errors=True)
                shutil.copytree(memory_home, home,
                                ignore=shutil.ignore_patterns("daemon", "memory-export.jsonl", "refcache"))
                try:
                    async with Client(server_params(home, config),
                                      client_info=Implementation(name=f"bench-{arm}", version="1")) as client:
                        run = await agent(client, task_id, arm, config.budget, seed, ranking, measure)
                except Exception as exc:
                    run = failed_run(task_id, arm, seed, config.budget, exc)
                    progress.note(f"seed {seed} {arm} {task_id}: FAILED, not a result ({run.error}); "
                                  "`kope bench --resume` runs it again")
                shutil.rmtree(home, ignore_errors=True)
                if meter is not None:
                    meter.add(run.prompt_tokens, run.completion_tokens)
                runs[arm].append(run)
                progress.finished(_line(label, i + 1, len(held), run))
            if config.judge_rounds and not any(runs[arm][-1].error for arm in arms):
                progress.started(f"seed {seed} judge", task_id)
                try:
                    judged = await judge_task(judge, task_id, [runs[arm][-1] for arm in arms], config.judge_rounds)
                except Exception as exc:
                    for arm in arms:
                        runs[arm][-1].error = f"the judge failed: {_reason(exc)}"
                    progress.note(f"seed {seed} judge {task_id}: FAILED ({_reason(exc)}); not a result")
                else:
                    passes[f"{task_id}@{size}"] = judged.passes
                    progress.note(f"seed {seed} judge {task_id}: {len(judged.speedups)} kernels re-profiled "
                                  f"{config.judge_rounds}x interleaved" +
                                  (f", {len(judged.failed)} failed every time" if judged.failed else ""))
            if measure is not None:
                # Metrics read the figure every arm decided on, measured to a stated width; the judge's own
                # passes are kept as its test-retest. A model decides on its own profiles (no decisions here):
                # its curve stays the judge's.
                for run in (runs[arm][-1] for arm in arms):
                    if not run.error and run.decisions:
                        run.judged = judged_curve(run, measure.speedups(task_id, run.kept))
            keep(runs)


@contextlib.asynccontextmanager
async def _shared_measure(config: BenchConfig) -> AsyncIterator[SharedMeasure | None]:
    """The run's shared measurer (measure.py): one server of its own for every seed and size, its figures kept in
    the run's folder; None when the configuration decides on each arm's own profile."""
    if not config.shared_measure:
        yield None
        return
    async with Client(server_params(config.out / "measure-home", config, profile_s=config.measure_profile_s),
                      client_info=Implementation(name="bench-measure", version="1")) as client:
        yield SharedMeasure(client, config.out / MEASURED, MeasureConfig(width=config.measure_width))


def _reason(exc: BaseException) -> str:
    """One line for what failed, from inside the task groups that wrap it."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]


def failed_run(task_id: str, arm: str, seed: int, budget: int, exc: BaseException) -> TaskRun:
    """The record of a run that stopped on a failure: not a result (metrics skip it), and re-run on resume. An
    endpoint that refuses the model (its key, its address) stops the whole bench instead."""
    from kope_mcp.bench.llm import endpoint_failure

    if endpoint_failure(exc) is not None:
        raise exc
    return TaskRun(task_id=task_id, family="", policy=arm, seed=seed, budget=budget, error=_reason(exc))


async def _static_order(home: Path, config: BenchConfig) -> list[str]:
    client_info = Implementation(name="bench-static", version="1")
    async with Client(server_params(home, config), client_info=client_info) as c:
        return static_order(await read_history(c))


def to_json(results: list[SeedResult]) -> list[dict[str, object]]:
    return [{"seed": r.seed, "warmup": r.warmup, "held_out": r.held_out, "warmup_seconds": r.warmup_seconds,
             "static_order": r.static_order, "memory_attempts": r.memory_attempts, "judge_passes": r.judge_passes,
             "runs": {p: [asdict(run) for run in runs] for p, runs in r.runs.items()},
             "sized_runs": {size: {p: [asdict(run) for run in runs] for p, runs in by_arm.items()}
                            for size, by_arm in r.sized_runs.items()}} for r in results]


def from_json(rows: list[dict[str, Any]]) -> list[SeedResult]:
    """results.json back into results (to re-render a report)."""
    def runs(by_arm: dict[str, list[dict[str, Any]]]) -> dict[str, list[TaskRun]]:
        return {arm: [TaskRun(**r) for r in items] for arm, items in by_arm.items()}
    return [SeedResult(seed=r["seed"], warmup=r["warmup"], held_out=r["held_out"], runs=runs(r["runs"]),
                       sized_runs={size: runs(b) for size, b in r.get("sized_runs", {}).items()},
                       warmup_seconds=r.get("warmup_seconds", 0.0), static_order=r.get("static_order", []),
                       memory_attempts=r.get("memory_attempts", {}), judge_passes=r.get("judge_passes", {}))
            for r in rows]
