#!/usr/bin/env python3
"""How repeatable is profile_kernel? An A/A test: profile the same kernel N times through a real stdio server
and print per-run medians, the spread of the medians across runs, and the spread of the interleaved speedup.

    python tools/bench_profile.py                      # every task, naive baseline at -O3 -march=native, 5 runs
    python tools/bench_profile.py --tasks matmul relu --repeats 5 --flags -O2
    python tools/bench_profile.py --tasks matmul softmax --identical --busy   # the A/A test, idle and busy
    python tools/bench_profile.py --identical --busy --spinners 3 --compare ../kope-previous --repeats 7

Each run is a separate profile_kernel call (a fresh child process), which is what an agent comparing attempts
sees. `--identical` profiles the baseline's own source without extra flags, so every speedup should be 1; `fired`
counts the runs whose CI lies wholly above 1 (the "faster than the incumbent" rule would have fired on identical
code). `--busy` repeats everything with every other CPU kept busy (`--spinners N` CPU-bound processes), side by
side, with the load average. `--compare DIR` runs a second server from another checkout and alternates the two
profile by profile, one row each: a change to the protocol measured against the previous one in the same run.
Quote medians and spreads, not single figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
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
def _load(spinners: int) -> Iterator[None]:
    """Keep `spinners` CPU-bound shell loops running while the block runs."""
    procs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(spinners)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _server(checkout: Path | None, home: str) -> StdioServerParameters:
    """`kope serve` from this checkout, or from another one (its own code first on the path)."""
    env = {**os.environ, "KOPE_HOME": home}
    if checkout is not None:
        env["PYTHONPATH"] = str(checkout)
    return StdioServerParameters(command=sys.executable, args=["-m", "kope_mcp", "serve", "--log-level", "WARNING"],
                                 env=env, cwd=str(checkout) if checkout else None)


async def _prepare(client: Client, task_id: str, flags: list[str]) -> str | None:
    task = await _call(client, "get_task", task_id=task_id)
    compiled = await _call(client, "compile_kernel", task_id=task_id, source=task["baseline_source"],
                           flags=flags, strategy="benchmark")
    if not compiled["ok"]:
        print(f"{task_id:<12} compile failed: {compiled['log'][-300:]}")
        return None
    if not (await _call(client, "run_tests", kernel_id=compiled["kernel_id"]))["passed"]:
        print(f"{task_id:<12} tests failed")
        return None
    return str(compiled["kernel_id"])


def _row(task_id: str, label: str, loadavg: float, runs: list[dict[str, Any]], seconds: list[float]) -> None:
    failed = [r["failure"] for r in runs if r.get("failure")]
    runs = [r for r in runs if not r.get("failure")]
    if not runs:
        print(f"{task_id:<12} {label:<12} every run failed: {failed}")
        return
    medians = [r["kernel"]["median_s"] * 1e3 for r in runs]
    speedups = [r["speedup_vs_baseline"] for r in runs]
    fired = sum(r["speedup_vs_baseline_ci95"][0] > 1.0 for r in runs)
    base = statistics.median(r["baseline"]["median_s"] * 1e3 for r in runs)
    riqr = statistics.median(r["kernel"]["relative_iqr"] for r in runs)
    print(f"{task_id:<12} {label:<12} {loadavg:7.2f} {base:11.3f} {_spread(medians):<44} "
          f"{' '.join(f'{v:.3f}' for v in speedups):<36} {_spread(speedups):<40} "
          f"{fired:>2}/{len(runs):<2} {riqr:7.1%} {statistics.median(seconds):6.1f}"
          + (f"  failed: {failed}" if failed else ""), flush=True)


async def main(args: argparse.Namespace) -> int:
    home = args.home or tempfile.mkdtemp(prefix="kope-bench-")
    spinners = args.spinners if args.spinners is not None else (
        max(1, (os.cpu_count() or 1) - 1) if args.busy else 0)
    conditions = [0, spinners] if spinners else [0]
    checkouts: dict[str, Path | None] = {"this": None}
    if args.compare:
        checkouts["other"] = Path(args.compare).resolve()
    async with AsyncExitStack() as stack:
        clients = {name: await stack.enter_async_context(Client(_server(path, f"{home}/{name}")))
                   for name, path in checkouts.items()}
        first = next(iter(clients.values()))
        task_ids = args.tasks or [line.split(" ", 1)[0] for line in (await _call(first, "list_tasks"))["tasks"]]
        print(f"{'task':<12} {'run':<12} {'loadavg':>7} {'baseline ms':>11} {'kernel median spread':<44} "
              f"{'speedup per run':<36} {'speedup spread':<40} {'fired':>5} {'rel IQR':>7} {'wall s':>6}")
        for task_id in task_ids:
            flags = [] if args.identical else args.flags
            kernels = {name: await _prepare(client, task_id, flags) for name, client in clients.items()}
            if any(k is None for k in kernels.values()):
                continue
            for spin in conditions:
                runs: dict[str, list[dict[str, Any]]] = {name: [] for name in clients}
                seconds: dict[str, list[float]] = {name: [] for name in clients}
                with _load(spin):
                    for i in range(args.repeats):
                        order = list(clients) if i % 2 == 0 else list(reversed(clients))  # alternate who goes first
                        for name in order:
                            started = time.perf_counter()
                            runs[name].append(await _call(clients[name], "profile_kernel", kernel_id=kernels[name],
                                                          time_reference=False))
                            seconds[name].append(time.perf_counter() - started)
                    loadavg = os.getloadavg()[0]
                for name in clients:
                    label = ("idle" if not spin else f"busy x{spin}") + ("" if len(clients) == 1 else f" {name}")
                    _row(task_id, label, loadavg, runs[name], seconds[name])
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
    parser.add_argument("--spinners", type=int, help="CPU-bound processes beside the busy runs (default: CPUs - 1)")
    parser.add_argument("--compare", help="another checkout of kope-mcp, profiled alternately in the same run")
    sys.exit(anyio.run(main, parser.parse_args()))
