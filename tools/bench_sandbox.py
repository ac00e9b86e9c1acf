#!/usr/bin/env python3
"""What does isolation cost? Time compile_kernel (never cached) and run_tests, and a bare sandboxed `true`.

    python tools/bench_sandbox.py                               # this checkout, 7 rounds
    python tools/bench_sandbox.py --compare /path/to/other/checkout --rounds 9

With --compare, each round runs the same work once in this checkout and once in the other (order alternating,
each in a fresh process with its own KOPE_HOME), so both see the same machine load: side by side, medians and
interquartile ranges per task. Quote medians and spreads, not single figures; this machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

TASKS = ("vector_add", "softmax", "matmul")
ROOT = Path(__file__).resolve().parent.parent


def measure(tasks: list[str]) -> dict[str, float]:
    """One round in this process: per task, seconds of an uncached compile and of run_tests."""
    from kope_mcp.services.workbench import Workbench
    from kope_mcp.settings import KopeSettings

    home = Path(tempfile.mkdtemp(prefix="kope-bench-sandbox-"))
    bench = Workbench(KopeSettings.from_env(home=home, embeddings=False))
    out: dict[str, float] = {}
    for task_id in tasks:
        source = bench.tasks.get(task_id).baseline_source
        assert source is not None
        bench.compile_kernel(task_id, source + "\n// warm\n")  # the baseline's build and the compiler's caches
        t0 = time.perf_counter()
        compiled = bench.compile_kernel(task_id, source + f"\n// {uuid.uuid4()}\n")
        out[f"{task_id} compile"] = time.perf_counter() - t0
        assert compiled.ok, compiled.log
        t0 = time.perf_counter()
        report = bench.run_tests(compiled.kernel_id)
        out[f"{task_id} run_tests"] = time.perf_counter() - t0
        assert report.passed, report.message
        # The same sandboxed harness run on the listed cases only: what isolation costs, without the case this
        # version draws near the profiling size.
        from kope_mcp.targets.native_runner import PreparedCase

        task = bench.tasks.get(task_id)
        cases = [PreparedCase(c.name, c.sizes, task.make_inputs(c.sizes, task.case_seed(c))) for c in task.spec.cases]
        library = bench.targets["c"].artifact(bench.store.attempt(compiled.kernel_id).build_hash)
        t0 = time.perf_counter()
        outcome = bench.targets["c"].runner.run_tests(task, library, cases, 30.0, False)
        out[f"{task_id} harness"] = time.perf_counter() - t0
        assert outcome.status == "ok", outcome.message
    bench.store.close()
    return out


def child(checkout: Path, tasks: list[str]) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KOPE_")}
    env["PYTHONPATH"] = str(checkout)
    done = subprocess.run([sys.executable, "-S", __file__, "--child", *tasks], env={
        **env, "PYTHONPATH": os.pathsep.join([str(checkout), *_site_dirs()])},
        capture_output=True, text=True, cwd=checkout, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _site_dirs() -> list[str]:
    return [p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))]


def _summary(values: list[float]) -> str:
    q1, med, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
    return f"{med * 1e3:8.1f} ms (IQR {q1 * 1e3:.1f}-{q3 * 1e3:.1f})"


def main(args: argparse.Namespace) -> int:
    if args.child:
        print(json.dumps(measure(args.child)))
        return 0
    checkouts = {"this": ROOT}
    if args.compare:
        checkouts["other"] = Path(args.compare).resolve()
    times: dict[str, dict[str, list[float]]] = {name: {} for name in checkouts}
    for round_ in range(args.rounds):
        order = list(checkouts) if round_ % 2 == 0 else list(reversed(checkouts))
        for name in order:
            for key, value in child(checkouts[name], list(args.tasks)).items():
                times[name].setdefault(key, []).append(value)
        print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    print(f"{'':<22}" + "".join(f"{name + ' (' + str(path) + ')':<44}" for name, path in checkouts.items()))
    for key in times["this"]:
        print(f"{key:<22}" + "".join(f"{_summary(times[name][key]):<44}" for name in checkouts))
    if not args.compare:
        from kope_mcp.runtime.sandbox import SandboxLimits, Scratch, run_sandboxed, scrubbed_env

        bare = []
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(20):
                with Scratch(Path(tmp)) as scratch:
                    t0 = time.perf_counter()
                    run_sandboxed(["true"], scratch=scratch, limits=SandboxLimits(), env=scrubbed_env())
                    bare.append(time.perf_counter() - t0)
        plain = []
        for _ in range(20):
            t0 = time.perf_counter()
            subprocess.run(["true"], check=True)
            plain.append(time.perf_counter() - t0)
        print(f"{'sandboxed `true`':<22}{_summary(bare)}   plain `true`: {_summary(plain)}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="*", default=list(TASKS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--compare", help="another checkout of kope-mcp to time side by side")
    parser.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    sys.exit(main(parser.parse_args()))
