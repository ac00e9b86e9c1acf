#!/usr/bin/env python3
"""What the cluster costs and how it scales, on a real local Ray cluster (token-authenticated, as in production).

    python tools/bench_cluster.py                 # overhead (40 calls), throughput for 1-16 workers, fairness
    python tools/bench_cluster.py --calls 100 --workers 1 2 4 8 16 --job-s 0.25

1. Dispatch overhead: the same cached compile_kernel through the workbench on this server's own `c` and on a
   worker's `c@w1` (same machine), interleaved; the medians and their difference per call (goal: <= 30 ms).
2. Throughput: a batch of profile jobs spread over N workers, on a target whose jobs only wait (`--job-s`), so
   the 2 cores here are not the limit: jobs/s against the ideal N / job_s.
3. Fairness: on one device, client A queues 12 jobs at once and client B 4 just after; where B's jobs finish in
   the order of completion (the fair slot lets the client that used the device least go first).

Prints figures with the load average; tests never assert them.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kope_mcp.cluster.config import ray_environment
from kope_mcp.hardware import HardwareProfile
from kope_mcp.settings import KopeSettings
from kope_mcp.targets.base import CompileOptions, Measurement, Target, TargetStatus
from kope_mcp.targets.builds import BuildResult
from kope_mcp.targets.native_runner import HarnessOutcome, PreparedCase
from kope_mcp.tasks.loader import Task

JOB_S = float(os.environ.get("KOPE_BENCH_JOB_S", "0.25"))


class WaitTarget(Target):
    """A device whose every job waits JOB_S seconds: the dispatcher's scaling without the CPUs' limit. Defined in
    this script, so Ray ships it to the actors by value."""

    name = "wait"
    language = "c"
    source_kind = "any text"
    job_s = JOB_S

    def status(self) -> TargetStatus:
        return TargetStatus(compile=True, run=True, profile=True, summary="waits")

    def hardware(self) -> HardwareProfile:
        return HardwareProfile(key="wait/0c", arch="none", cpu_model="none", cores=1, isa=[], caches=[])

    def signature(self, task: Task) -> str | None:
        return "kernel"

    def baseline_source(self, task: Task) -> str | None:
        return None

    def compile(self, task: Task, source: str, flags: list[str], options: CompileOptions) -> BuildResult:
        return BuildResult(build_hash="wait", ok=True, diagnostics=[], log="", seconds=0.0, cached=True,
                           artifact=None)

    def check_build(self, build_hash: str) -> None:
        return None

    def run_cases(self, task: Task, build_hash: str, cases: list[PreparedCase], *, wall_s: float) -> HarnessOutcome:
        time.sleep(self.job_s)
        return HarnessOutcome(status="ok")

    def profile(self, task: Task, build_hash: str, sets: list[PreparedCase], *, with_reference: bool,
                time_cap_s: float, consistency: tuple[float, float], wall_s: float) -> Measurement:
        time.sleep(self.job_s)
        return Measurement(outcome=HarnessOutcome(status="ok"), baseline_key="baseline")


class LongWaitTarget(WaitTarget):
    """A job that is still running when its node is taken away."""

    name = "longwait"
    job_s = 60.0


def _spread(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"median {statistics.median(values):7.2f}  IQR {q[0]:.2f}-{q[2]:.2f}  (n={len(values)})"


def main(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="kope-bench-cluster-"))
    token = root / "token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    os.environ.update(ray_environment(token))
    import ray
    from ray.cluster_utils import Cluster

    from kope_mcp.cluster.worker import start_devices
    from kope_mcp.services.workbench import Workbench
    from kope_mcp.targets.registry import load_targets

    most = max(args.workers)
    workers = [f"w{i}" for i in range(1, most + 1)]
    t0 = time.monotonic()
    # The head is a node whose resources let every worker name place its actor there: N "machines" as N actors on
    # one node, so the figure is the dispatcher's and Ray's, not this machine's raylets'.
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "include_dashboard": False, "resources": {f"kope-node:{w}": 1 for w in workers}})
    try:
        ray.init(address=cluster.address, namespace="kope", log_to_driver=False)
        start_devices("w1", root / "w1", ["c"])
        for w in workers:
            start_devices(w, root / w, ["wait"], {"wait": WaitTarget})
        print(f"cluster with {most} workers up in {time.monotonic() - t0:.1f} s; load {os.getloadavg()[0]:.2f}")
        settings = KopeSettings.from_env(home=root / "server", embeddings=False).model_copy(
            update={"cluster": cluster.address, "cluster_token": str(token)})
        local = load_targets(settings)
        bench = Workbench(settings, targets={**local, "wait": WaitTarget(settings)})
        task = bench.tasks.get("relu")
        source = task.baseline_source or ""

        # 1. overhead
        for device in ("c", "c@w1"):
            bench.compile_kernel("relu", source, device=None if device == "c" else device)  # build once
        times: dict[str, list[float]] = {"c": [], "c@w1": []}
        for i in range(args.calls):
            for device in (("c", "c@w1") if i % 2 == 0 else ("c@w1", "c")):
                start = time.perf_counter()
                bench.compile_kernel("relu", source, device=None if device == "c" else device)
                times[device].append((time.perf_counter() - start) * 1e3)
        extra = [r - c for c, r in zip(times["c"], times["c@w1"], strict=True)]
        print(f"\n1. dispatch overhead, cached compile_kernel through the workbench (ms per call, load "
              f"{os.getloadavg()[0]:.2f}):")
        print(f"   this server's c : {_spread(times['c'])}")
        print(f"   worker's c@w1   : {_spread(times['c@w1'])}")
        print(f"   difference      : {_spread(extra)}   (goal <= 30 ms)")

        # 2. throughput
        print(f"\n2. throughput: {args.jobs} profile jobs of {JOB_S:g} s each, spread over N workers "
              f"(load {os.getloadavg()[0]:.2f}):")
        devices = bench.cluster.devices(refresh=True) if bench.cluster is not None else {}
        for n in args.workers:
            chosen = [devices[f"wait@{w}"] for w in workers[:n]]

            def job(i: int, chosen: list[Target] = chosen) -> None:
                target = chosen[i % len(chosen)]
                with bench.measure_slot(f"wait@{workers[i % len(chosen)]}").hold(f"client{i % 2}"):
                    target.profile(task, "wait", [], with_reference=False, time_cap_s=1, consistency=(0, 0),
                                   wall_s=60)

            start = time.perf_counter()
            with ThreadPoolExecutor(max_workers=min(64, args.jobs)) as pool:
                list(pool.map(job, range(args.jobs)))
            wall = time.perf_counter() - start
            ideal = n / JOB_S
            print(f"   N={n:>2}: {args.jobs / wall:6.1f} jobs/s, ideal {ideal:6.1f} ({args.jobs / wall / ideal:.0%}), "
                  f"{wall:.2f} s")

        # 3. fairness on one device
        target = devices["wait@w1"]
        finished: list[str] = []
        lock = threading.Lock()

        def fair_job(client: str) -> None:
            with bench.measure_slot("wait@w1").hold(client):
                target.profile(task, "wait", [], with_reference=False, time_cap_s=1, consistency=(0, 0), wall_s=60)
            with lock:
                finished.append(client)

        threads = [threading.Thread(target=fair_job, args=("A",)) for _ in range(12)]
        for thread in threads:
            thread.start()
        time.sleep(JOB_S / 2)
        late = [threading.Thread(target=fair_job, args=("B",)) for _ in range(4)]
        for thread in late:
            thread.start()
        for thread in threads + late:
            thread.join()
        order = "".join(finished)
        print(f"\n3. fairness on one device: A queued 12 jobs, B 4 just after; completion order {order}; B's jobs "
              f"finished at positions {[i + 1 for i, c in enumerate(order) if c == 'B']} of {len(order)} "
              f"(a plain queue: 13-16)")

        # 4. a node lost mid-job
        lost_node = cluster.add_node(num_cpus=1, resources={"kope-node:lost": 1})
        start_devices("lost", root / "lost", ["longwait"], {"longwait": LongWaitTarget})
        bench.targets["longwait"] = LongWaitTarget(settings)
        doomed = bench.cluster.devices(refresh=True)["longwait@lost"] if bench.cluster is not None else None
        assert doomed is not None
        raised: list[BaseException] = []

        def doomed_job() -> None:
            try:
                doomed.profile(task, "wait", [], with_reference=False, time_cap_s=1, consistency=(0, 0), wall_s=60)
            except BaseException as exc:
                raised.append(exc)

        caller = threading.Thread(target=doomed_job)
        caller.start()
        time.sleep(2.0)
        removed = time.perf_counter()
        cluster.remove_node(lost_node)
        caller.join(timeout=120)
        print(f"\n4. a node removed 2 s into a 60 s job: the call ended after {time.perf_counter() - removed:.1f} s "
              f"with {(str(raised[0]).splitlines() or [''])[0][:110] if raised else 'no error'}")
        bench.store.close()
    finally:
        ray.shutdown()
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=64)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    sys.exit(main(parser.parse_args()))
