#!/usr/bin/env python3
"""What each of the scripted agent's strategies really does to each task, applied once to the naive baseline:
compile error, wrong results, or a measured speedup. Prints one row per (family, strategy) with the tasks it
applies to, its failures and the median and range of its speedups, so the catalogue's claims (some do not
compile, some are wrong on awkward sizes, some are slower, the loop rewrites differ by family) are checked
against real gcc and real measurements, through a real `kope serve` over stdio.

    python tools/bench_catalogue.py                          # every task (~15 min here)
    python tools/bench_catalogue.py --families matmul reduction --profile-s 0.2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict

import anyio
from mcp import Client, StdioServerParameters

from kope_mcp.bench.agent import attempt, call_tool
from kope_mcp.bench.candidates import BY_NAME, CHOICES, Kernel


async def main(args: argparse.Namespace) -> int:
    home = args.home or tempfile.mkdtemp(prefix="kope-catalogue-")
    env = {**os.environ, "KOPE_HOME": home, "KOPE_PROFILE_S": str(args.profile_s), "KOPE_EMBEDDINGS": "off"}
    params = StdioServerParameters(command=sys.executable, args=["-m", "kope_mcp", "serve", "--no-daemon",
                                                               "--log-level", "WARNING"], env=env)
    # (family, strategy) -> outcomes; a speedup for each correct candidate.
    outcomes: dict[tuple[str, str], list[str]] = defaultdict(list)
    speedups: dict[tuple[str, str], list[float]] = defaultdict(list)
    started = time.monotonic()
    async with Client(params) as client:
        task_ids = [line.split(" ", 1)[0] for line in (await call_tool(client, "list_tasks"))["tasks"]]
        for task_id in task_ids:
            task = await call_tool(client, "get_task", task_id=task_id)
            if (args.families and task["family"] not in args.families) or not task["baseline_source"]:
                continue
            baseline = Kernel(task["baseline_source"])
            for name in CHOICES:
                candidate = BY_NAME[name].apply(baseline)
                if candidate is None:
                    continue
                outcome, _, _, speedup = await attempt(client, task_id, candidate, name, None, None, 1.0)
                key = (task["family"], name)
                outcomes[key].append("compile error" if outcome == "compile_error" else
                                     "wrong" if outcome == "incorrect" else "correct")
                if speedup is not None:
                    speedups[key].append(speedup)
            print(f"[{time.monotonic() - started:6.0f} s] {task_id}", file=sys.stderr, flush=True)
    print(f"\n{'family':<15} {'strategy':<34} {'tasks':>5} {'no compile':>10} {'wrong':>6}  speedup vs naive "
          "(median, min-max)")
    for family, name in sorted(outcomes):
        done = outcomes[(family, name)]
        ups = speedups[(family, name)]
        spread = f"{statistics.median(ups):6.2f}x ({min(ups):.2f}-{max(ups):.2f})" if ups else "-"
        print(f"{family:<15} {name:<34} {len(done):>5} {done.count('compile error'):>10} {done.count('wrong'):>6}"
              f"  {spread}")
    print(f"\n{sum(len(v) for v in outcomes.values())} candidates in {time.monotonic() - started:.0f} s "
          f"(KOPE_PROFILE_S={args.profile_s}, home {home})")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="*", help="only these families (default: all)")
    parser.add_argument("--profile-s", type=float, default=0.2, help="KOPE_PROFILE_S for the server")
    parser.add_argument("--home", help="KOPE_HOME to use (default: a fresh temp dir)")
    sys.exit(anyio.run(main, parser.parse_args()))
