"""The ablation protocol: warm a memory on some tasks, then run every policy on held-out tasks from copies of
that same memory, for several seeds.

Split (documented, seeded): within each family the task ids are shuffled with the seed; the first half
(rounded up) warms the memory, the rest are held out, so every family is represented on both sides. The warm-up
runs the `none` policy (it explores in random order, so the memory holds wins and failures of every strategy).
Each policy then starts from a copy of the warmed home, so no policy sees another's held-out experience.
Every agent talks to a real `kope serve` over stdio (owning its home, --no-daemon).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from mcp import Client, StdioServerParameters
from mcp.types import Implementation

from kope_mcp.bench.agent import TaskRun, arms, run_task, static_order
from kope_mcp.bench.transcript import WINDOWS

QUICK_FAMILIES = ("activation", "reduction", "normalization")


@dataclass
class BenchConfig:
    out: Path
    seeds: int = 3
    budget: int = 8
    families: tuple[str, ...] | None = None  # None: all
    per_family: int | None = None  # cap on tasks per family and side (quick mode)
    profile_s: float = 0.2
    embeddings: bool = False
    windows: tuple[int, ...] = WINDOWS  # the context windows (tokens) the memory policies are read through

    @property
    def arms(self) -> tuple[str, ...]:
        return arms(self.windows)


@dataclass
class SeedResult:
    seed: int
    warmup: list[str]
    held_out: list[str]
    runs: dict[str, list[TaskRun]] = field(default_factory=dict)
    warmup_seconds: float = 0.0
    static_order: list[str] = field(default_factory=list)


class Progress(Protocol):
    def started(self, label: str, task_id: str) -> None: ...
    def finished(self, line: str) -> None: ...
    def note(self, line: str) -> None: ...


def split(tasks: Mapping[str, str], seed: int, per_family: int | None = None) -> tuple[list[str], list[str]]:
    """(warm-up, held-out) task ids from {task_id: family}."""
    warm: list[str] = []
    held: list[str] = []
    for family in sorted(set(tasks.values())):
        ids = sorted(t for t, f in tasks.items() if f == family)
        random.Random(f"split/{seed}/{family}").shuffle(ids)
        cut = math.ceil(len(ids) / 2)
        first, rest = ids[:cut], ids[cut:]
        if per_family is not None:
            first, rest = first[:per_family], rest[:per_family]
        warm += first
        held += rest
    return warm, held


def server_params(home: Path, config: BenchConfig) -> StdioServerParameters:
    env = {**os.environ, "KOPE_HOME": str(home), "KOPE_PROFILE_S": str(config.profile_s),
           "KOPE_EMBEDDINGS": "on" if config.embeddings else "off"}
    return StdioServerParameters(command=sys.executable, args=["-m", "kope_mcp", "serve", "--no-daemon",
                                                               "--log-level", "WARNING"], env=env)


async def run_tasks(home: Path, config: BenchConfig, policy: str, task_ids: list[str], seed: int,
                     progress: Progress, label: str | None = None, static: list[str] | None = None
                     ) -> list[TaskRun]:
    runs: list[TaskRun] = []
    label = label or f"seed {seed} {policy}"
    client_info = Implementation(name=f"bench-{policy}", version="1")
    async with Client(server_params(home, config), client_info=client_info) as c:
        for i, task_id in enumerate(task_ids, 1):
            progress.started(label, task_id)
            run = await run_task(c, task_id, policy, config.budget, seed, static)
            runs.append(run)
            progress.finished(f"{label:<16} [{i:>2}/{len(task_ids)}] {task_id:<22} "
                              f"{'solved' if run.solved else 'FAILED':<6} best {run.best_speedup:6.2f}x  "
                              f"attempts {run.attempts}  context {run.context_tokens} tok  {run.seconds:5.1f} s")
    return runs


def plan(config: BenchConfig, tasks: Mapping[str, str], seed: int) -> tuple[list[str], list[str]]:
    """(warm-up, held-out) task ids of one seed under this configuration."""
    if config.families is not None:
        tasks = {t: f for t, f in tasks.items() if f in config.families}
    return split(tasks, seed, config.per_family)


async def run_seed(config: BenchConfig, tasks: Mapping[str, str], seed: int, progress: Progress) -> SeedResult:
    warm, held = plan(config, tasks, seed)
    result = SeedResult(seed=seed, warmup=warm, held_out=held)
    root = config.out / f"seed-{seed}"
    warm_home = root / "warm"
    started = time.monotonic()
    progress.note(f"seed {seed}: warming the memory on {len(warm)} tasks, {len(held)} held out")
    await run_tasks(warm_home, config, "none", warm, seed + 10_000, progress, f"seed {seed} warm-up")
    result.warmup_seconds = time.monotonic() - started
    result.static_order = await _static_order(warm_home, config)
    for arm in config.arms:
        home = root / arm.replace("@", "-")
        shutil.copytree(warm_home, home, ignore=shutil.ignore_patterns("daemon"))
        result.runs[arm] = await run_tasks(home, config, arm, held, seed, progress, static=result.static_order)
    return result


async def _static_order(home: Path, config: BenchConfig) -> list[str]:
    async with Client(server_params(home, config), client_info=Implementation(name="bench-static", version="1")) as c:
        raw = "".join(getattr(x, "text", "") for x in (await c.read_resource("kope://memory/history.json")).contents)
    return static_order(json.loads(raw))


def to_json(results: list[SeedResult]) -> list[dict[str, object]]:
    return [{"seed": r.seed, "warmup": r.warmup, "held_out": r.held_out, "warmup_seconds": r.warmup_seconds,
             "static_order": r.static_order,
             "runs": {p: [asdict(run) for run in runs] for p, runs in r.runs.items()}} for r in results]
