"""What a bench run is: its configuration, the seeded warm-up/held-out split, and the server every agent uses."""

from __future__ import annotations

import json
import math
import os
import random
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from mcp import StdioServerParameters

from kope_mcp.bench.agent import TaskRun, arms
from kope_mcp.bench.transcript import WINDOWS

QUICK_FAMILIES = ("activation", "reduction", "normalization")
MEMORYLESS = ("none", "oracle")  # arms that read no memory: run once, on the largest, and shown at every size


@dataclass
class BenchConfig:
    out: Path
    seeds: int = 3
    budget: int = 8
    families: tuple[str, ...] | None = None  # None: all
    per_family: int | None = None  # cap on tasks per family and side (quick mode)
    held_per_family: int | None = None  # cap on held-out tasks per family (the warm-up keeps its half)
    profile_s: float = 0.2
    embeddings: bool = False
    windows: tuple[int, ...] = WINDOWS  # the context windows (tokens) the memory policies are read through
    warm_passes: int = 1  # passes of the warm-up over its tasks, each in another random order
    warm_budget: int | None = None  # attempts per task in the warm-up (None: `budget`; 14 tries every strategy)
    imports: tuple[Path, ...] = ()  # kope-memory exports added to the warmed memory (other hardware's experience)
    one_core_warmup: bool = False  # also warm up pinned to one core and import that (a distinct `1c` hardware key)
    memory_sizes: tuple[int, ...] = ()  # attempts kept of the warmed memory (a seeded family-stratified sample)
    sized_windows: tuple[int, ...] | None = None  # windows whose arms also run at the cut sizes (None: all)
    catalogue_repeats: int = 3  # profiles of each contender for a task's best in the catalogue (median kept)
    judge_rounds: int = 3  # re-profiles of every arm's incumbents after each task (judge.py); 0: off
    # Every arm keeps or rejects a candidate on one shared figure per distinct kernel (measure.py), profiled at
    # `measure_profile_s` until its interval is within `measure_width`; False: each arm on its own profile
    shared_measure: bool = True
    measure_profile_s: float = 0.3
    measure_width: float = 0.05
    max_tokens: int | None = None  # --agent llm: the run stops before a task once the model has spent this many
    # task -> bytes its profiling size moves: when given, each family's held-out tasks are taken smallest first
    # (the seeded order breaks ties), so the full run fits its time; empty: the seeded order alone
    footprints: Mapping[str, float] = field(default_factory=dict)
    warm_per_family: int | None = None  # warm-up tasks per family (None: the whole warm-up half)
    one_core_per_family: int | None = None  # warm-up tasks per family in the one-core warm-up (None: all)

    @property
    def arms(self) -> tuple[str, ...]:
        return arms(self.windows)

    def arms_at(self, size: str) -> tuple[str, ...]:
        """The arms run from a memory of this size: every one on the whole memory; on a cut memory, static and
        the memory policies at `sized_windows` (the curve against memory size)."""
        if size == "all" or self.sized_windows is None:
            return self.arms
        kept = {f"{p}@{w // 1000}k" for w in self.sized_windows for p in ("passive", "active")}
        return tuple(a for a in self.arms if a == "static" or a in kept)


@dataclass
class SeedResult:
    seed: int
    warmup: list[str]
    held_out: list[str]
    runs: dict[str, list[TaskRun]] = field(default_factory=dict)  # arm -> runs, on the largest memory
    sized_runs: dict[str, dict[str, list[TaskRun]]] = field(default_factory=dict)  # memory size -> arm -> runs
    warmup_seconds: float = 0.0
    static_order: list[str] = field(default_factory=list)
    memory_attempts: dict[str, int] = field(default_factory=dict)  # size label -> attempts in that memory
    # task -> kernel key -> the judge's figure in each pass (None: that pass failed): its own test-retest
    judge_passes: dict[str, dict[str, list[float | None]]] = field(default_factory=dict)


CONFIG_FILE = "bench-config.json"


def save_config(config: BenchConfig) -> None:
    """The run's configuration next to its results: `kope bench --resume DIR` goes on with exactly it."""
    fields = {k: (str(v) if isinstance(v, Path) else [str(p) for p in v] if k == "imports" else v)
              for k, v in asdict(config).items() if k != "out"}
    (config.out / CONFIG_FILE).write_text(json.dumps(fields, indent=1))


def load_config(out: Path) -> BenchConfig:
    """The configuration a run in `out` was started with (see :func:`save_config`)."""
    fields: dict[str, Any] = json.loads((out / CONFIG_FILE).read_text())
    for name, value in fields.items():
        if isinstance(value, list):
            fields[name] = tuple(Path(p) for p in value) if name == "imports" else tuple(value)
    return BenchConfig(out=out, **fields)


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


def plan(config: BenchConfig, tasks: Mapping[str, str], seed: int) -> tuple[list[str], list[str]]:
    """(warm-up, held-out) task ids of one seed under this configuration."""
    if config.families is not None:
        tasks = {t: f for t, f in tasks.items() if f in config.families}
    warm, held = split(tasks, seed, config.per_family)
    if config.warm_per_family is not None:
        warm = first_per_family(warm, tasks, config.warm_per_family)
    # The warm-up's order across families is shuffled too: a memory filled family by family would give its
    # oldest part (what a truncating reader loses first) to the first families alone.
    random.Random(f"warm-order/{seed}").shuffle(warm)
    if config.held_per_family is not None:
        per_family: dict[str, list[str]] = {}
        for task_id in held:
            per_family.setdefault(tasks[task_id], []).append(task_id)
        for ids in per_family.values():
            ids.sort(key=lambda t: config.footprints.get(t, 0.0))  # stable: ties keep the seeded order
        held = [t for t in held if t in per_family[tasks[t]][:config.held_per_family]]
    return warm, held


def one_core_warmup_tasks(config: BenchConfig, tasks: Mapping[str, str], warm: list[str]) -> list[str]:
    """The warm-up tasks the one-core warm-up runs: the first `one_core_per_family` of each family."""
    if config.one_core_per_family is None:
        return warm
    return first_per_family(warm, tasks, config.one_core_per_family)


def first_per_family(task_ids: list[str], tasks: Mapping[str, str], n: int) -> list[str]:
    """The first `n` task ids of each family, in their order."""
    seen: dict[str, int] = {}
    kept = []
    for task_id in task_ids:
        seen[tasks[task_id]] = seen.get(tasks[task_id], 0) + 1
        if seen[tasks[task_id]] <= n:
            kept.append(task_id)
    return kept


def server_params(home: Path, config: BenchConfig, pin_one_core: bool = False,
                  profile_s: float | None = None) -> StdioServerParameters:
    """A private `kope serve` on `home`; pinned to one core, its hardware key says `1c` (other hardware)."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)  # a home must be private (the server says so otherwise)
    env = {**os.environ, "KOPE_HOME": str(home), "KOPE_PROFILE_S": str(profile_s or config.profile_s),
           "KOPE_EMBEDDINGS": "on" if config.embeddings else "off"}
    command = [sys.executable, "-m", "kope_mcp", "serve", "--no-daemon", "--log-level", "WARNING"]
    if pin_one_core:
        command = ["taskset", "-c", "0", *command]
    return StdioServerParameters(command=command[0], args=command[1:], env=env)
