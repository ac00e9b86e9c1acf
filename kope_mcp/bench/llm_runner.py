"""`kope bench --agent llm`: the ablation protocol with a real model as the agent.

The memory is warmed by the scripted agent (cheap, no model calls) on the warm-up tasks, then the model works
every held-out task once per policy (none, passive, active), each policy from its own copy of the warmed
memory, through a real `kope serve`. Reported per policy: prompt and completion tokens from the endpoint's
`usage` (per call and in total), what the policy injected, compiles, tool errors and the best speedup.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path

from mcp import Client
from mcp.types import Implementation

from kope_mcp.bench.config import BenchConfig, Progress, plan, server_params
from kope_mcp.bench.llm import LLM_POLICIES, LlmSettings, LlmTaskRun, run_llm_task
from kope_mcp.bench.protocol import run_tasks
from kope_mcp.bench.report import geomean
from kope_mcp.tasks.registry import TaskRegistry


async def run_llm_bench(config: BenchConfig, settings: LlmSettings, progress: Progress,
                        policies: tuple[str, ...] = LLM_POLICIES) -> Path:
    config.out.mkdir(parents=True, exist_ok=True)
    tasks = {t.id: t.spec.family for t in TaskRegistry.default().list()}
    started = time.monotonic()
    results: dict[str, list[LlmTaskRun]] = {}
    for seed in range(config.seeds):
        warm, held = plan(config, tasks, seed)
        root = config.out / f"seed-{seed}"
        progress.note(f"seed {seed}: the scripted agent warms the memory on {len(warm)} tasks")
        await run_tasks(root / "warm", config, "none", warm, seed + 10_000, progress, f"seed {seed} warm-up")
        for policy in policies:
            home = root / f"llm-{policy}"
            shutil.copytree(root / "warm", home, ignore=shutil.ignore_patterns("daemon"))
            async with Client(server_params(home, config),
                              client_info=Implementation(name=f"llm-{policy}", version=settings.model)) as client:
                for task_id in held:
                    progress.started(f"seed {seed} llm {policy}", task_id)
                    run = await run_llm_task(client, settings, task_id, policy)
                    results.setdefault(policy, []).append(run)
                    progress.finished(f"seed {seed} llm {policy:<8} {task_id:<22} compiles {run.compiles} "
                                      f"best {run.best_speedup or 0:.2f}x prompt {run.usage.prompt_tokens:,} tok "
                                      f"({run.usage.calls} calls) {run.seconds:.1f} s")
            (config.out / "results.json").write_text(json.dumps(
                {p: [r.as_json() for r in runs] for p, runs in results.items()}, indent=1))
    report = config.out / "report.md"
    report.write_text(llm_markdown(results, settings, time.monotonic() - started))
    return report


def llm_markdown(results: dict[str, list[LlmTaskRun]], settings: LlmSettings, wall_s: float) -> str:
    lines = [f"# KOPE ablation with `{settings.model}` at {settings.base_url}", "",
             f"Context window {settings.context_window:,} tokens (the chat is trimmed to it); query_experience "
             f"budget {settings.token_budget:,}; at most {settings.attempts} compiles per task. Wall time "
             f"{wall_s / 60:.1f} min. Tokens are the endpoint's `usage`.", "",
             "| policy | tasks | prompt tokens (total) | prompt tokens per call (median) | completion tokens | "
             "memory tokens injected | calls | compiles | tool errors | trimmed and resent | best speedup "
             "(geomean over profiled tasks) |", "| --- |" + " --- |" * 10]
    for policy, runs in results.items():
        per_call = [t for r in runs for t in r.usage.per_call_prompt]
        speeds = [r.best_speedup for r in runs if r.best_speedup]
        lines.append(f"| {policy} | {len(runs)} | {sum(r.usage.prompt_tokens for r in runs):,} | "
                     f"{statistics.median(per_call) if per_call else 0:,.0f} | "
                     f"{sum(r.usage.completion_tokens for r in runs):,} | {sum(r.context_tokens for r in runs):,} | "
                     f"{sum(r.usage.calls for r in runs)} | {sum(r.compiles for r in runs)} | "
                     f"{sum(r.tool_errors for r in runs)} | {sum(r.trimmed_retries for r in runs)} | "
                     f"{f'{geomean(speeds):.2f}' if speeds else '-'} |")
    return "\n".join(lines) + "\n"
