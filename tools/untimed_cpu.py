#!/usr/bin/env python3
"""What kernels spend outside their timed calls, next to the naive baseline's in the same run.

profile_kernel compares the candidate's CPU time at load (library, constructors) with the naive baseline's
loading in the same run, and its first (untimed) call with its typical timed call (services/verdicts.py:
untimed_work_reasons). This profiles honest kernels (baselines, the demo's fast matmul, an OpenMP one) and two that
work where nothing is timed (a constructor that spins, a first call that does a hundred calls' work), and prints
each one's figures and what the verdict said, so the allowances can be read against what honest code needs.

    python tools/untimed_cpu.py --repeats 3
    python tools/untimed_cpu.py --busy        # with one CPU-bound process per core beside it
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from kope_mcp.app import demo_sources
from kope_mcp.services import workbench as workbench_mod
from kope_mcp.services.workbench import Workbench
from kope_mcp.settings import KopeSettings
from kope_mcp.tasks.registry import TaskRegistry

SPIN = "static void spin(double s) { volatile double x = 0; for (long i = 0; i < (long)(s * 4e8); i++) x += i; }\n"
OMP_MATMUL = """#include <stdint.h>
void kernel(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K) {
    #pragma omp parallel for
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            float s = 0;
            for (int64_t k = 0; k < K; k++) s += A[i * K + k] * B[k * N + j];
            C[i * N + j] = s;
        }
}
"""


def kernels(registry: TaskRegistry) -> dict[str, tuple[str, str, list[str]]]:
    found: dict[str, tuple[str, str, list[str]]] = {}
    present = {task.id: task for task in registry.list()}
    for task_id in ("matmul", "mse_loss", "softmax", "relu", "conv2d"):
        if task_id in present and (baseline := present[task_id].folder / "baseline.c").is_file():
            found[f"{task_id} baseline"] = (task_id, baseline.read_text(), ["-O2"])
    found["matmul fast (demo)"] = ("matmul", demo_sources.FAST_KERNEL, demo_sources.FAST_FLAGS)
    found["matmul openmp"] = ("matmul", OMP_MATMUL, ["-O2", "-fopenmp"])
    fast = demo_sources.FAST_KERNEL
    spins = "__attribute__((constructor)) static void ahead(void) { spin(0.3); }\n"
    found["spins 0.3 s at load"] = ("matmul", "#include <stdint.h>\n" + SPIN + spins
                                    + fast.replace("#include <stdint.h>", ""), demo_sources.FAST_FLAGS)
    first = fast.replace("void kernel(", "static void real(").rstrip() + """
static int calls;
void kernel(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K) {
    int reps = calls++ ? 1 : 100;
    for (int r = 0; r < reps; r++) real(A, B, C, M, N, K);
}
"""
    found["first call does 100 calls' work"] = ("matmul", first, demo_sources.FAST_FLAGS)
    return found


def main(args: argparse.Namespace) -> None:
    seen: list[dict[str, Any]] = []
    original = workbench_mod.untimed_work_reasons

    def recording(result: dict[str, Any], median: float, threads: int) -> list[str]:
        reasons = original(result, median, threads)
        seen.append({**result, "median": median, "threads": threads, "reasons": reasons})
        return reasons

    workbench_mod.untimed_work_reasons = recording  # type: ignore[assignment]
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(os.cpu_count() or 1)] \
        if args.busy else []
    for p in spinners:
        p.start()
    registry = TaskRegistry.default()
    with tempfile.TemporaryDirectory() as home:
        bench = Workbench(KopeSettings.from_env(home=Path(home), embeddings=False), registry)
        print(f"load average {os.getloadavg()[0]:.1f}, {args.repeats} profiles each; CPU seconds, medians (ranges)")
        print(f"{'kernel':32} {'load':>17} {'baseline load':>17} {'warm-up':>17} {'typical call':>17}  flagged")
        for name, (task_id, source, flags) in kernels(registry).items():
            compiled = bench.compile_kernel(task_id, source, strategy=f"untimed cpu: {name}", flags=flags)
            if not compiled.ok:
                print(f"{name:32} did not compile: {compiled.log[:200]}")
                continue
            tested = bench.run_tests(compiled.kernel_id)
            if not tested.passed:
                print(f"{name:32} failed its tests: {tested.message[:160]}")
                continue
            rows, flagged = [], 0
            for _ in range(args.repeats):
                seen.clear()
                report = bench.profile_kernel(compiled.kernel_id)
                if not seen:
                    print(f"{name:32} no measurement: {report.failure} {report.message[:120]}")
                    break
                r = seen[-1]
                typical = max(r["median"] * max(1, r["threads"]),
                              r.get("cpu_seconds", 0) / max(1, r.get("candidate_calls", 2) - 1))
                rows.append((r["untimed_cpu_seconds"] - r.get("warmup_cpu_seconds", 0),
                             r.get("baseline_untimed_cpu_seconds", 0) - r.get("baseline_warmup_cpu_seconds", 0),
                             r.get("warmup_cpu_seconds", 0), typical))
                flagged += bool(r["reasons"])
            if rows:
                cols = [_fmt([row[i] for row in rows]) for i in range(4)]
                print(f"{name:32} {cols[0]:>17} {cols[1]:>17} {cols[2]:>17} {cols[3]:>17}  {flagged}/{len(rows)}")
        bench.store.close()
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    for p in spinners:
        p.terminate()


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def _spin() -> None:
    while True:
        pass


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--busy", action="store_true", help="one CPU-bound process per core beside it")
    main(parser.parse_args())
