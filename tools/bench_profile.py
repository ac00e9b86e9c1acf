#!/usr/bin/env python3
"""How repeatable is profile_kernel? An A/A test: profile the same kernel N times through a real stdio server
and print per-run medians, the spread of the medians across runs, and the spread of the interleaved speedup.

    python tools/bench_profile.py                      # every task, naive baseline at -O3 -march=native, 5 runs
    python tools/bench_profile.py --tasks matmul relu --repeats 5 --flags -O2
    python tools/bench_profile.py --tasks matmul softmax --identical --busy   # the A/A test, idle and busy

Each run is a separate profile_kernel call (a fresh child process), which is what an agent comparing attempts
sees. `--identical` profiles the baseline's own source without extra flags, so every speedup should be 1; `fired`
counts the runs whose CI lies wholly above 1 (the "faster than the incumbent" rule would have fired on identical
code). `--busy` repeats everything with every other CPU kept busy, side by side, with the load average. Quote
medians and spreads, not single figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def _load(busy: bool) -> Iterator[None]:
    """Keep every CPU but one busy (a shell loop each) while the block runs."""
    spinners = [subprocess.Popen(["sh", "-c", "while :; do :; done"])
                for _ in range(max(1, (os.cpu_count() or 1) - 1))] if busy else []
    try:
        yield
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()


async def main(args: argparse.Namespace) -> int:
    home = args.home or tempfile.mkdtemp(prefix="kope-bench-")
    env = {**os.environ, "KOPE_HOME": home}
    params = StdioServerParameters(command=sys.executable, args=["-m", "kope_mcp", "serve", "--log-level", "WARNING"],
                                   env=env)
    conditions = ["idle", "busy"] if args.busy else ["idle"]
    async with Client(params) as client:
        task_ids = args.tasks or [line.split(" ", 1)[0] for line in (await _call(client, "list_tasks"))["tasks"]]
        print(f"{'task':<12} {'load':<5} {'loadavg':>7} {'baseline ms':>11} {'kernel median spread':<44} "
              f"{'speedup per run':<36} {'speedup spread':<40} {'fired':>5} {'rel IQR':>7}")
        for task_id in task_ids:
            task = await _call(client, "get_task", task_id=task_id)
            flags = [] if args.identical else args.flags
            compiled = await _call(client, "compile_kernel", task_id=task_id, source=task["baseline_source"],
                                   flags=flags, strategy="benchmark")
            if not compiled["ok"]:
                print(f"{task_id:<12} compile failed: {compiled['log'][-300:]}")
                continue
            if not (await _call(client, "run_tests", kernel_id=compiled["kernel_id"]))["passed"]:
                print(f"{task_id:<12} tests failed")
                continue
            for condition in conditions:
                with _load(condition == "busy"):
                    runs = [await _call(client, "profile_kernel", kernel_id=compiled["kernel_id"],
                                        time_reference=False) for _ in range(args.repeats)]
                    loadavg = os.getloadavg()[0]
                failed = [r["failure"] for r in runs if r.get("failure")]
                runs = [r for r in runs if not r.get("failure")]
                if not runs:
                    print(f"{task_id:<12} {condition:<5} every run failed: {failed}")
                    continue
                medians = [r["kernel"]["median_s"] * 1e3 for r in runs]
                speedups = [r["speedup_vs_baseline"] for r in runs]
                fired = sum(r["speedup_vs_baseline_ci95"][0] > 1.0 for r in runs)
                base = statistics.median(r["baseline"]["median_s"] * 1e3 for r in runs)
                riqr = statistics.median(r["kernel"]["relative_iqr"] for r in runs)
                print(f"{task_id:<12} {condition:<5} {loadavg:7.2f} {base:11.3f} {_spread(medians):<44} "
                      f"{' '.join(f'{v:.3f}' for v in speedups):<36} {_spread(speedups):<40} "
                      f"{fired:>2}/{len(runs):<2} {riqr:7.1%}" + (f"  failed: {failed}" if failed else ""),
                      flush=True)
    print(f"\nKOPE_HOME used: {home}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="*", help="task ids (default: all)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--flags", nargs="*", default=["-O3", "-march=native"])
    parser.add_argument("--home", help="KOPE_HOME to use (default: a fresh temporary one)")
    parser.add_argument("--identical", action="store_true", help="profile the baseline's own source and flags (A/A)")
    parser.add_argument("--busy", action="store_true", help="repeat with every other CPU busy, side by side")
    sys.exit(anyio.run(main, parser.parse_args()))
