"""`kope bench`: run the ablation protocol, then write report.md, results.json and PNG plots."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from kope_mcp.bench.protocol import QUICK_FAMILIES, BenchConfig, SeedResult, run_seed, to_json
from kope_mcp.bench.report import markdown, plots
from kope_mcp.tasks.registry import TaskRegistry


def quick_config(out: Path) -> BenchConfig:
    """CI-sized: three families, one warm-up and one held-out task each, one seed, 4 attempts."""
    return BenchConfig(out=out, seeds=1, budget=4, families=QUICK_FAMILIES, per_family=1, profile_s=0.1)


def _progress(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


async def run_bench(config: BenchConfig) -> Path:
    """Run every seed; returns the report's path (plots next to it)."""
    config.out.mkdir(parents=True, exist_ok=True)
    tasks = {t.id: t.spec.family for t in TaskRegistry.default().list()}
    started = time.monotonic()
    results: list[SeedResult] = []
    for seed in range(config.seeds):
        results.append(await run_seed(config, tasks, seed, _progress))
        (config.out / "results.json").write_text(json.dumps(to_json(results), indent=1))
    report = config.out / "report.md"
    text = markdown(results, config.budget, time.monotonic() - started)
    images = plots(results, config.budget, config.out)
    report.write_text(text + "\n" + "\n".join(f"![{p.stem}]({p.name})" for p in images) + "\n")
    return report
