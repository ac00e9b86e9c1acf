"""The measured catalogue: each strategy applied once to each task's naive kernel and profiled once; the
contenders for the best are profiled `repeats` times in all (the median kept). Through a real `kope serve` of its
own. It gives the oracle arm its order (best measured first, failures last) and the floor of the best known
speedup per task.
"""

from __future__ import annotations

import json
import statistics
from typing import Any

from mcp import Client
from mcp.types import Implementation

from kope_mcp.bench.agent import attempt, call_tool
from kope_mcp.bench.candidates import BY_NAME, CHOICES, Kernel
from kope_mcp.bench.config import BenchConfig, Progress, server_params

CONTENDER = 0.8  # re-profiled when within this fraction of the task's best first figure

Catalogue = dict[str, dict[str, float | None]]  # task -> strategy -> median speedup (None: failed or unmeasured)


async def measure_catalogue(config: BenchConfig, task_ids: list[str], progress: Progress,
                            repeats: int = 3) -> Catalogue:
    """Measured speedups of every applicable strategy on every task (cached in out/catalogue.json)."""
    path = config.out / "catalogue.json"
    known: Catalogue = json.loads(path.read_text()) if path.exists() else {}
    missing = [t for t in task_ids if t not in known]
    if not missing:
        return known
    client_info = Implementation(name="bench-catalogue", version="1")
    async with Client(server_params(config.out / "catalogue-home", config), client_info=client_info) as client:
        for i, task_id in enumerate(missing, 1):
            progress.started("catalogue", task_id)
            known[task_id] = await _measure_task(client, task_id, repeats)
            best = max((v for v in known[task_id].values() if v), default=1.0)
            progress.note(f"catalogue [{i:>2}/{len(missing)}] {task_id:<22} {len(known[task_id])} strategies, "
                          f"best {best:.2f}x")
            path.write_text(json.dumps(known, indent=1))
    return known


async def _measure_task(client: Client, task_id: str, repeats: int) -> dict[str, float | None]:
    """Every applicable strategy profiled once; the contenders for the best (within `CONTENDER` of the best
    first figure) profiled `repeats` times in all, their median kept: the best known speedup is a median of
    `repeats`, without re-measuring strategies that cannot be it."""
    task = await call_tool(client, "get_task", task_id=task_id)
    naive = Kernel(task["baseline_source"] or "")
    root = await call_tool(client, "compile_kernel", task_id=task_id, source=naive.source,
                           strategy="naive baseline", agent="catalogue")
    firsts: dict[str, tuple[str, float] | None] = {}
    for name in CHOICES:
        candidate = BY_NAME[name].apply(naive)
        if candidate is None:
            continue
        outcome, kernel_id, _, speedup = await attempt(client, task_id, candidate, name, root["session_id"],
                                                       root["kernel_id"], 1.0)
        ok = speedup is not None and outcome in ("correct", "faster")
        firsts[name] = (kernel_id, float(speedup)) if ok and speedup is not None else None
    best = max((f[1] for f in firsts.values() if f), default=0.0)
    out: dict[str, float | None] = {}
    for name, first in firsts.items():
        if first is None:
            out[name] = None
            continue
        kernel_id, speedup = first
        speedups = [speedup]
        if speedup >= CONTENDER * best:
            for _ in range(repeats - 1):
                again = await call_tool(client, "profile_kernel", kernel_id=kernel_id, time_reference=False)
                if again.get("speedup_vs_baseline") is not None:
                    speedups.append(float(again["speedup_vs_baseline"]))
        out[name] = round(statistics.median(speedups), 4)
    return out


def oracle_order(catalogue: Catalogue, task_id: str) -> list[str]:
    """The strategies for a task, best measured first; failed ones last."""
    measured: dict[str, Any] = catalogue.get(task_id, {})
    return sorted(measured, key=lambda name: -(measured[name] or 0.0))


def best_from_catalogue(catalogue: Catalogue) -> dict[str, float]:
    return {task: max([v for v in by.values() if v] or [1.0]) for task, by in catalogue.items()}
