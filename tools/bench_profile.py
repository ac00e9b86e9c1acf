#!/usr/bin/env python3
"""How repeatable is profile_kernel? Profile the same kernels N times through a real stdio server and print
per-run medians, the spread of the medians across runs, and the spread of the interleaved speedup.

    python tools/bench_profile.py                      # every task, naive baseline at -O3 -march=native, 5 runs
    python tools/bench_profile.py --tasks matmul relu --repeats 5 --flags -O2

Each run is a separate profile_kernel call (a fresh child process), which is what an agent comparing attempts
sees. Run it on an otherwise idle machine and quote medians and spreads, not single figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from typing import Any

import anyio
from mcp import Client, StdioServerParameters


async def _call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    if result.is_error or result.structured_content is None:
        raise SystemExit(f"{tool} failed: {result.content}")
    return result.structured_content


def _spread(values: list[float]) -> str:
    med = statistics.median(values)
    return f"median {med:.4g}, range {min(values):.4g}-{max(values):.4g} ({(max(values) - min(values)) / med:.1%})"


async def main(args: argparse.Namespace) -> int:
    home = args.home or tempfile.mkdtemp(prefix="kope-bench-")
    env = {**os.environ, "KOPE_HOME": home}
    params = StdioServerParameters(command=sys.executable, args=["-m", "kope_mcp", "serve", "--log-level", "WARNING"],
                                   env=env)
    async with Client(params) as client:
        task_ids = args.tasks or [line.split(" ", 1)[0] for line in (await _call(client, "list_tasks"))["tasks"]]
        print(f"{'task':<12} {'baseline ms':>12} {'kernel ms (per run)':<48} {'kernel median spread':<44} "
              f"{'speedup spread':<40} {'rel IQR'}")
        for task_id in task_ids:
            task = await _call(client, "get_task", task_id=task_id)
            compiled = await _call(client, "compile_kernel", task_id=task_id, source=task["baseline_source"],
                                   flags=args.flags, strategy="benchmark")
            if not compiled["ok"]:
                print(f"{task_id:<12} compile failed: {compiled['log'][-300:]}")
                continue
            if not (await _call(client, "run_tests", kernel_id=compiled["kernel_id"]))["passed"]:
                print(f"{task_id:<12} tests failed")
                continue
            runs = [await _call(client, "profile_kernel", kernel_id=compiled["kernel_id"])
                    for _ in range(args.repeats)]
            medians = [r["kernel"]["median_s"] * 1e3 for r in runs]
            speedups = [r["speedup_vs_baseline"] for r in runs]
            base = statistics.median(r["baseline"]["median_s"] * 1e3 for r in runs)
            riqr = statistics.median(r["kernel"]["relative_iqr"] for r in runs)
            print(f"{task_id:<12} {base:12.3f} {' '.join(f'{m:.3f}' for m in medians):<48} {_spread(medians):<44} "
                  f"{_spread(speedups):<40} {riqr:.1%}", flush=True)
    print(f"\nKOPE_HOME used: {home}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="*", help="task ids (default: all)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--flags", nargs="*", default=["-O3", "-march=native"])
    parser.add_argument("--home", help="KOPE_HOME to use (default: a fresh temporary one)")
    sys.exit(anyio.run(main, parser.parse_args()))
