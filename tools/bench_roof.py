#!/usr/bin/env python3
"""How close honest kernels come to the calibrated memory roof (services/verdicts.py: beyond_memory_roof).

For every task whose profiling working set is at least hardware.ROOF_MIN_BYTES, the naive baseline built at
-O3 -march=native (vectorised where the compiler can) is tested and profiled; the table prints the working set,
the GB/s it reached, what this machine streams at that size (the probe the roof uses) and their ratio. The roof
flags a result above ROOFLINE_MARGIN times the probe: every honest ratio should sit well below it.

    python tools/bench_roof.py                 # every task
    python tools/bench_roof.py --tasks relu mse_loss sum_reduce
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from kope_mcp import hardware
from kope_mcp.services.verdicts import ROOFLINE_MARGIN
from kope_mcp.services.workbench import Workbench
from kope_mcp.settings import KopeSettings
from kope_mcp.tasks.registry import TaskRegistry


def main(args: argparse.Namespace) -> None:
    registry = TaskRegistry.default()
    tasks = [t for t in registry.list() if (not args.tasks or t.id in args.tasks) and t.baseline_source]
    ratios: list[float] = []
    with tempfile.TemporaryDirectory() as home:
        bench = Workbench(KopeSettings.from_env(home=Path(home), embeddings=False), registry)
        print(f"load average {os.getloadavg()[0]:.1f}; roof = {ROOFLINE_MARGIN}x the probe at the working set's size")
        print(f"{'task':28} {'working set':>12} {'GB/s':>8} {'probe GB/s':>11} {'ratio':>6}  suspect")
        for task in tasks:
            nbytes = task.spec.byte_count(task.spec.profile.sizes)
            if nbytes < hardware.ROOF_MIN_BYTES:
                continue
            compiled = bench.compile_kernel(task.id, task.baseline_source or "", strategy="roof check",
                                            flags=["-O3", "-march=native"])
            if not compiled.ok or not bench.run_tests(compiled.kernel_id).passed:
                print(f"{task.id:28} not measured (compile or tests failed)")
                continue
            report = bench.profile_kernel(compiled.kernel_id)
            if report.gbytes_per_s is None:
                print(f"{task.id:28} not measured: {report.failure}")
                continue
            probe = hardware.streaming_bandwidth_gbps(footprint=nbytes) * max(1, report.threads)
            ratio = report.gbytes_per_s / probe
            ratios.append(ratio)
            roof = [r for r in report.suspect_reasons if "streams over" in r]
            print(f"{task.id:28} {nbytes / 2**20:9.1f} MiB {report.gbytes_per_s:8.1f} {probe:11.1f} {ratio:6.2f}  "
                  f"{'ROOF' if roof else '-'}")
        bench.store.close()
    if ratios:
        print(f"{len(ratios)} tasks: ratio median {statistics.median(ratios):.2f}, max {max(ratios):.2f} "
              f"(flagged above {ROOFLINE_MARGIN}); load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="*", default=[])
    main(parser.parse_args())
