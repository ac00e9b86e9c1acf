"""`kope worker` as an operator runs it: two started at the same moment on one machine both serve, a killed one
leaves no devices and no node behind, and workers come back by themselves to a head that was killed and
restarted."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kope_mcp.cluster.config import ray_environment
from kope_mcp.services.workbench import Workbench
from tests.e2e.local_ray import NEEDS_RAY

pytestmark = NEEDS_RAY


def start_worker(address: str, name: str, token: Path, home: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "KOPE_HOME": str(home), "KOPE_CLUSTER_TOKEN": str(token)}
    return subprocess.Popen([sys.executable, "-m", "kope_mcp", "worker", "--cluster", address, "--name", name,
                             "--backend", "c"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def listed(bench: Workbench) -> set[str]:
    return {d.id for d in bench.list_devices().devices}


def wait_for(test, what: str, seconds: float, workers: list[subprocess.Popen[str]] = ()) -> None:  # type: ignore[assignment]
    deadline = time.monotonic() + seconds
    while not test():
        for worker in workers:
            assert worker.poll() is None, (worker.returncode, worker.stderr.read() if worker.stderr else "")
        assert time.monotonic() < deadline, f"not within {seconds:.0f} s: {what}"
        time.sleep(1)


def stop(workers: list[subprocess.Popen[str]]) -> list[int]:
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    codes = []
    for worker in workers:
        try:
            codes.append(worker.wait(timeout=90))
        except subprocess.TimeoutExpired:
            worker.kill()
            codes.append(worker.wait())
    return codes


def processes_naming(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def close(bench: Workbench) -> None:
    if bench.cluster is not None:
        bench.cluster.close()
    bench.store.close()


def test_two_workers_started_at_the_same_moment_on_one_machine_both_serve(cluster, tmp_path):
    workers = [start_worker(cluster.address, name, cluster.token, tmp_path / name) for name in ("delta", "epsilon")]
    bench = Workbench(cluster.settings(tmp_path / "home"))
    try:
        wait_for(lambda: {"c@delta", "c@epsilon"} <= listed(bench), "both devices listed", 240, workers)
        assert stop(workers) == [0, 0]
        wait_for(lambda: not {"c@delta", "c@epsilon"} & listed(bench), "both withdrawn", 60)
    finally:
        stop(workers)
        close(bench)


def test_a_killed_kope_worker_leaves_no_devices_and_no_node_behind(cluster, tmp_path):
    worker = start_worker(cluster.address, "zeta", cluster.token, tmp_path / "zeta")
    bench = Workbench(cluster.settings(tmp_path / "home"))
    try:
        wait_for(lambda: "c@zeta" in listed(bench), "the device listed", 240, [worker])
        assert processes_naming("kope-node:zeta")  # its node runs
        worker.kill()  # SIGKILL: nothing of the supervisor runs again
        worker.wait()
        wait_for(lambda: "c@zeta" not in listed(bench), "the device gone", 90)
        wait_for(lambda: not processes_naming("kope-node:zeta"), "its node gone", 60)
    finally:
        stop([worker])
        close(bench)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _head(port: int, token: Path, root: Path) -> subprocess.Popen[bytes]:
    ray = str(Path(sys.executable).with_name("ray"))
    env = {**os.environ, **ray_environment(token)}
    return subprocess.Popen([ray, "start", "--head", "--port", str(port), "--block", "--num-cpus", "1",
                             "--include-dashboard", "false", "--disable-usage-stats",
                             "--object-store-memory", str(256 * 1024**2)],
                            env=env, stdout=subprocess.DEVNULL, stderr=(root / "head.log").open("ab"),
                            start_new_session=True)


def _kill_head(head: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(head.pid, signal.SIGKILL)
    head.wait()


@pytest.mark.timeout(900)
def test_workers_come_back_by_themselves_to_a_head_that_was_killed_and_restarted(cluster, tmp_path):
    port = _free_port()
    address = f"127.0.0.1:{port}"
    head = _head(port, cluster.token, tmp_path)
    workers: list[subprocess.Popen[str]] = []
    bench = None
    try:
        wait_for(lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0, "the head listening", 120)
        workers = [start_worker(address, "eta", cluster.token, tmp_path / "eta")]
        bench = Workbench(cluster.settings(tmp_path / "home").model_copy(update={"cluster": address}))
        wait_for(lambda: "c@eta" in listed(bench), "the device listed", 240, workers)
        _kill_head(head)
        wait_for(lambda: "c@eta" not in listed(bench), "the device gone with the head", 120, workers)
        # Ray refuses to start a head at an address a local node still names: on one machine (here, not in a real
        # cluster) the worker's node must be gone first. Its supervisor ends it once the head stops answering.
        wait_for(lambda: not processes_naming("kope-node:eta"), "the worker's old node ended", 120, workers)
        head = _head(port, cluster.token, tmp_path)  # the same address, a new cluster
        wait_for(lambda: "c@eta" in listed(bench), "the device back without touching the worker", 400, workers)
        compiled = bench.compile_kernel("relu", bench.tasks.get("relu").baseline_source or "", device="c@eta")
        assert compiled.ok and bench.run_tests(compiled.kernel_id).passed
        assert stop(workers) == [0]
    finally:
        stop(workers)
        if bench is not None:
            close(bench)
        _kill_head(head)
