"""Two `kope worker` machines on a real local Ray cluster (a head and a second node, token-authenticated), driven
through the real MCP client: routing by device, hardware keys in the memory, a node lost mid-profile, a worker
that comes back, a client without the token, and `kope worker` itself."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

from kope_mcp.app.server import build_server
from kope_mcp.errors import DeviceLostError
from kope_mcp.memory.experience_memory import ExperienceMemory
from kope_mcp.services.workbench import Workbench
from kope_mcp.targets.base import TargetStatus
from kope_mcp.targets.registry import load_targets
from tests.conftest import VECTOR_ADD_OK
from tests.e2e.local_ray import NEEDS_RAY

pytestmark = NEEDS_RAY


def _close(bench: Workbench) -> None:
    if bench.cluster is not None:
        bench.cluster.close()  # its driver child, which would otherwise live as long as this test process
    bench.store.close()


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


def test_each_workers_device_is_listed_and_a_loop_routed_to_it_is_recorded_with_its_hardware(cluster, tmp_path):
    settings = cluster.settings(tmp_path / "home")
    server = build_server(settings)
    recorded: dict[str, tuple[str, str]] = {}  # kernel id -> (device, its hardware key)

    async def body() -> None:
        async with Client(server) as client:
            listed = await call(client, "list_devices")
            devices = {d["id"]: d for d in listed["devices"]}
            catalogue = await call(client, "list_tasks")
            assert {"c@alpha", "c@beta"} <= set(catalogue["devices"]["c"])
            assert {"c", "c@alpha", "c@beta"} <= set(devices)
            assert devices["c@beta"]["where"].startswith("worker beta") and devices["c@beta"]["status"] == "ready"
            for device in ("c@alpha", "c@beta"):
                compiled = await call(client, "compile_kernel", task_id="relu", device=device, flags=["-O2"],
                                      source=(await call(client, "get_task", task_id="relu"))["baseline_source"],
                                      strategy=f"baseline on {device}")
                assert compiled["ok"] and compiled["device"] == device and compiled["backend"] == "c"
                assert (await call(client, "run_tests", kernel_id=compiled["kernel_id"]))["passed"]
                profiled = await call(client, "profile_kernel", kernel_id=compiled["kernel_id"],
                                      time_reference=False)
                assert profiled["failure"] is None and profiled["speedup_vs_baseline"] > 0
                assert profiled["hardware"]["key"] == devices[device]["hardware_key"]
                assert not any("runs kernels at nice" in w for w in profiled["warnings"])  # not Ray's nice 15
                assert profiled["device"] == device and 0 < profiled["device_share"] <= 1
                recorded[compiled["kernel_id"]] = (device, devices[device]["hardware_key"])

    anyio.run(body)
    memory = ExperienceMemory.open(settings.memory_path, False)
    try:
        for kernel_id, (device, hardware_key) in recorded.items():
            attempt = memory.attempt(kernel_id)
            assert attempt.target == device and attempt.hardware_key == hardware_key
            assert attempt.tested and attempt.correct and attempt.median_s is not None
    finally:
        memory.close()


def test_an_unknown_device_is_one_line_naming_the_devices_there_are(cluster, tmp_path):
    server = build_server(cluster.settings(tmp_path / "home"))

    async def body() -> None:
        async with Client(server) as client:
            result = await client.call_tool("compile_kernel", {"task_id": "relu", "source": VECTOR_ADD_OK,
                                                               "device": "c@nowhere"})
            assert result.is_error
            text = result.content[0].text  # type: ignore[union-attr]
            assert text.startswith("unknown_device: no device 'c@nowhere'") and "c@alpha" in text

    anyio.run(body)


def test_a_node_lost_mid_profile_is_device_lost_nothing_is_recorded_and_a_returning_worker_is_listed_again(
        cluster, tmp_path):
    bench = Workbench(cluster.settings(tmp_path / "home", profile_time_cap_s=20.0))
    try:
        task = bench.tasks.get("vector_add")
        compiled = bench.compile_kernel("vector_add", task.baseline_source or "", device="c@beta")
        assert compiled.ok and bench.run_tests(compiled.kernel_id).passed
        failure: list[BaseException] = []

        def profile() -> None:
            try:
                bench.profile_kernel(compiled.kernel_id)
            except BaseException as exc:
                failure.append(exc)

        caller = threading.Thread(target=profile)
        caller.start()
        time.sleep(4.0)  # inputs drawn and shipped; the worker is measuring
        started = time.monotonic()
        cluster.cluster.remove_node(cluster.beta)
        caller.join(timeout=120)
        assert not caller.is_alive()
        assert len(failure) == 1 and isinstance(failure[0], DeviceLostError), failure
        assert str(failure[0]).startswith("device_lost: device c@beta")
        assert time.monotonic() - started < 60
        assert bench.memory.attempt(compiled.kernel_id).median_s is None
        assert "c@beta" not in {d.id for d in bench.list_devices().devices}

        cluster.beta = cluster.add_node("beta")
        assert cluster.start("beta") == ["c@beta"]
        assert "c@beta" in {d.id for d in bench.list_devices().devices}
    finally:
        _close(bench)


def test_a_client_without_the_token_is_refused(cluster, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["RAY_AUTH_MODE"] = "token"  # it tries token auth, with a token of its own
    (tmp_path / "wrong").write_text(secrets.token_hex(32))
    env["RAY_AUTH_TOKEN_PATH"] = str(tmp_path / "wrong")
    probe = (f"import ray; ray.init(address={cluster.address!r}, log_to_driver=False); "
             "print(ray.cluster_resources())")
    run = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "kope-node" not in run.stdout


def test_kope_worker_joins_as_a_node_offers_its_device_and_withdraws_it_on_sigterm(cluster, tmp_path):
    env = {**os.environ, "KOPE_HOME": str(tmp_path / "gamma-home"), "KOPE_CLUSTER_TOKEN": str(cluster.token)}
    worker = subprocess.Popen([sys.executable, "-m", "kope_mcp", "worker", "--cluster", cluster.address, "--name",
                               "gamma", "--backend", "c"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    bench = Workbench(cluster.settings(tmp_path / "home"))
    try:
        deadline = time.monotonic() + 120
        while "c@gamma" not in {d.id for d in bench.list_devices().devices}:
            assert worker.poll() is None, worker.stderr.read() if worker.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(1)
        import ray

        resources = ray.cluster_resources()
        assert "kope-backend:c" in resources and any(k.startswith("kope-hw:") for k in resources)
        compiled = bench.compile_kernel("relu", bench.tasks.get("relu").baseline_source or "", device="c@gamma")
        assert compiled.ok and bench.run_tests(compiled.kernel_id).passed
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0
        assert "c@gamma" not in {d.id for d in bench.list_devices().devices}
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        _close(bench)


def test_kope_serve_with_cluster_lists_the_workers_devices_to_a_stdio_client(cluster, tmp_path):
    # The real entry point: the stdio proxy, and a daemon that joins the cluster itself (on its own thread, with
    # a bounded wait), not the test process's connection.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    params = StdioServerParameters(
        command=sys.executable, env={**env, "KOPE_HOME": str(tmp_path / "home"), "KOPE_EMBEDDINGS": "off"},
        args=["-m", "kope_mcp", "serve", "--log-level", "WARNING", "--cluster", cluster.address,
              "--cluster-token", str(cluster.token)])

    async def body() -> None:
        with anyio.fail_after(180):
            async with Client(params) as client:
                listed = await call(client, "list_devices")
                assert {"c", "c@alpha", "c@beta"} <= {d["id"] for d in listed["devices"]}
                assert listed["cluster"] == cluster.address
                # Nothing but what this test's layout leaves open: its node runs as the server's own user.
                assert len(listed["warnings"]) == 1 and "runs as the server's own user" in listed["warnings"][0]

    anyio.run(body)


def test_a_call_without_a_device_goes_to_a_worker_when_this_server_cannot_time_that_backend(cluster, tmp_path):
    from ray import cloudpickle

    import tests.fake_target as fake

    cloudpickle.register_pickle_by_value(fake)  # the workers cannot import the tests package

    class CannotTimeHere(fake.FakeNumpyTarget):
        def status(self) -> TargetStatus:
            return TargetStatus(True, True, False, "compile and test only", why_not="no device for it here")

    assert cluster.start("alpha", {"fake": fake.FakeNumpyTarget}) == ["fake@alpha"]
    settings = cluster.settings(tmp_path / "home")
    bench = Workbench(settings, targets={**load_targets(settings), "fake": CannotTimeHere(settings)})
    try:
        task = bench.tasks.get("relu")
        source = bench.targets["fake"].baseline_source(task) or ""
        compiled = bench.compile_kernel("relu", source, backend="fake")
        assert compiled.ok and compiled.device == "fake@alpha" and compiled.backend == "fake"
        assert bench.run_tests(compiled.kernel_id).passed
        profiled = bench.profile_kernel(compiled.kernel_id, time_reference=False)
        assert profiled.failure is None and profiled.speedup_vs_baseline is not None
        here = bench.compile_kernel("relu", VECTOR_ADD_OK.replace("b[i]", "0"), backend="c")
        assert here.device == "c"  # this server times C itself: no reason to go elsewhere
    finally:
        _close(bench)


def _held_profile(release: str, expired: str) -> Any:
    """A fake profile that holds the device until ``release`` exists (at most 60 s, then it writes ``expired``)."""
    import tests.fake_target as fake

    def profile(self: Any, *args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + 60
        while not os.path.exists(release):
            if time.monotonic() > deadline:
                Path(expired).write_text("the device was held for 60 s")
                break
            time.sleep(0.05)
        return fake.FakeNumpyTarget.profile(self, *args, **kwargs)

    return type("HeldProfileTarget", (fake.FakeNumpyTarget,), {"profile": profile})


def test_a_compile_and_a_test_on_a_device_run_beside_its_profile(cluster, tmp_path):
    from ray import cloudpickle

    import tests.fake_target as fake

    cloudpickle.register_pickle_by_value(fake)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    release, expired = tmp_path / "release", tmp_path / "expired"
    assert cluster.start("beta", {"fake": _held_profile(str(release), str(expired))}) == ["fake@beta"]
    settings = cluster.settings(tmp_path / "home")
    bench = Workbench(settings, targets={**load_targets(settings), "fake": fake.FakeNumpyTarget(settings)})
    try:
        task = bench.tasks.get("relu")
        source = bench.targets["fake"].baseline_source(task) or ""
        first = bench.compile_kernel("relu", source, device="fake@beta")
        assert bench.run_tests(first.kernel_id).passed
        profiling = threading.Thread(target=bench.profile_kernel, args=(first.kernel_id,), daemon=True)
        profiling.start()
        deadline = time.monotonic() + 120
        while bench.measure_slot("fake@beta").queue == 0:  # inputs drawn; the profile is on its way to the worker
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(1.0)
        second = bench.compile_kernel("relu", source + "\n# another build\n", device="fake@beta")
        assert second.ok and bench.run_tests(second.kernel_id).passed
        assert not expired.exists()  # they ran while the profile held the device, not after it let go
        release.write_text("go")
        profiling.join(timeout=180)
        assert bench.memory.attempt(first.kernel_id).median_s is not None
    finally:
        release.write_text("go")
        _close(bench)


def test_the_server_outlives_a_head_that_dies_and_keeps_its_own_devices(cluster, tmp_path):
    # A Ray driver whose head dies terminates its process after a minute: the server's driver is a child of its
    # own, so what ends is that child. A second cluster (same token), which the test process does not drive.
    from ray.cluster_utils import Cluster

    other = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"kope-node:solo": 1}, "include_dashboard": False})
    bench = None
    try:
        start = (f"import ray; from pathlib import Path; ray.init(address={other.address!r}, namespace='kope', "
                 "log_to_driver=False); from kope_mcp.cluster.worker import start_devices; "
                 f"print(start_devices('solo', Path({str(tmp_path / 'solo')!r}), ['c']))")
        run = subprocess.run([sys.executable, "-c", start], capture_output=True, text=True, timeout=180)
        assert "c@solo" in run.stdout, run.stderr[-2000:]
        settings = cluster.settings(tmp_path / "home").model_copy(update={"cluster": other.address})
        bench = Workbench(settings)
        assert "c@solo" in {d.id for d in bench.list_devices().devices}
        other.head_node.kill_gcs_server()
        started = time.monotonic()
        listed = bench.list_devices()
        assert time.monotonic() - started < 60
        assert "c@solo" not in {d.id for d in listed.devices} and "c" in {d.id for d in listed.devices}
        assert listed.warnings and "did not answer" in listed.warnings[0]
        time.sleep(65)  # past the minute after which Ray ends a driver whose head is gone
        assert bench.compile_kernel("relu", bench.tasks.get("relu").baseline_source or "").ok
        again = bench.list_devices()
        assert "c" in {d.id for d in again.devices} and again.warnings
    finally:
        if bench is not None:
            _close(bench)
        other.shutdown()


def test_a_server_with_the_wrong_token_names_the_token_at_once_and_backs_off_keeping_its_own_devices(cluster,
                                                                                                    tmp_path):
    wrong = tmp_path / "wrong-token"
    wrong.write_text(secrets.token_hex(32))
    wrong.chmod(0o600)
    bench = Workbench(cluster.settings(tmp_path / "home").model_copy(update={"cluster_token": str(wrong)}))
    try:
        first = bench.list_devices()
        assert {d.id for d in first.devices} == {d.id for d in first.devices if "@" not in d.id}  # its own only
        assert any("refused this server's cluster token" in w and str(wrong) in w for w in first.warnings), first
        again = bench.list_devices()  # within the backoff: the same answer, not another attempt
        assert any("tried again in" in w for w in again.warnings), again.warnings
        try:
            bench.compile_kernel("relu", bench.tasks.get("relu").baseline_source or "", device="c@alpha")
            raise AssertionError("a routed call went through with the wrong token")
        except DeviceLostError as exc:
            assert "cluster token" in str(exc)
        assert bench.compile_kernel("relu", bench.tasks.get("relu").baseline_source or "").ok
    finally:
        _close(bench)
