"""What someone holding the cluster token can do to the server by registering actors of their own on a real local
Ray cluster: answers that would unpickle to code, a foreign actor class that would unpickle to code, a device whose
hardware key is not what its facts give. None of it runs anything in the server or its driver child, and none of
those devices is offered."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

from kope_mcp.app.server import build_server
from kope_mcp.cluster import wire
from kope_mcp.cluster.config import NAMESPACE, NODE_RESOURCE, actor_name
from kope_mcp.cluster.device_actor import DeviceDescription
from kope_mcp.services.workbench import Workbench
from kope_mcp.targets.registry import load_targets
from tests.e2e.local_ray import NEEDS_RAY, LocalCluster

pytestmark = NEEDS_RAY


def detonator_class(marker: str) -> type:
    """A class whose instances, unpickled, append the unpickling process's pid to ``marker``: proof of code run
    there. Made here and captured by the actors' methods, so Ray ships it by value (a worker cannot import this
    test module by name)."""

    class Detonator:
        def __reduce__(self) -> tuple[Any, ...]:
            return subprocess.call, (["sh", "-c", f"echo $PPID >> {shlex.quote(marker)}"],)

    return Detonator


def _masquerade(description: bytes | None, marker: str) -> type:
    """An actor class that calls itself kope's DeviceActor (same module and name) but answers with a pickle that
    runs code, or with ``description`` where one is given."""
    detonator = detonator_class(marker)

    def __init__(self: Any) -> None:
        pass

    def ready(self: Any) -> bool:
        return True

    def describe(self: Any) -> Any:
        return description if description is not None else detonator()

    def call(self: Any, method: str, payload: bytes) -> Any:
        return detonator()

    cls = type("DeviceActor", (), {"__init__": __init__, "ready": ready, "describe": describe, "call": call})
    cls.__module__, cls.__qualname__ = "kope_mcp.cluster.device_actor", "DeviceActor"
    return cls


def _foreign(marker: str) -> type:
    """An actor class of a module no driver can import: Ray ships it by value, a pickle that runs code wherever it
    is loaded (the worker hosting it, and any driver that makes a handle to it)."""
    cls = type("Spy", (), {"payload": detonator_class(marker)(), "ready": lambda self: True,
                           "describe": lambda self: b"", "call": lambda self, method, payload: b""})
    cls.__module__, cls.__qualname__ = "kope_spy_nowhere", "Spy"
    return cls


def _register(cls: type, worker: str, *args: Any) -> Any:
    import ray

    actor: Any = ray.remote(cls).options(name=actor_name(worker, "c"), namespace=NAMESPACE, lifetime="detached",
                                    num_cpus=0, resources={NODE_RESOURCE.format(name="beta"): 0.001}).remote(*args)
    assert ray.get(actor.ready.remote(), timeout=60) is True
    return actor


def _description(cluster: LocalCluster, tmp_path: Path, worker: str, key: str | None = None) -> bytes:
    target = load_targets(cluster.settings(tmp_path / "probe"))["c"]
    hardware = target.hardware()
    if key is not None:
        hardware = hardware.model_copy(update={"key": key})
    return wire.encode(DeviceDescription(worker=worker, backend="c", host="elsewhere", status=target.status(),
                                         hardware=hardware, roofline=target.roofline(), niceness=0))


def _pids(marker: Path) -> set[int]:
    return {int(line) for line in marker.read_text().split()} if marker.exists() else set()


def test_actors_that_answer_with_code_or_lie_about_their_hardware_run_nothing_in_the_server_and_are_not_offered(
        cluster, tmp_path):
    import ray

    marker = tmp_path / "ran"
    tmp_path.chmod(0o777)  # whichever user a process that unpickles runs as can leave its pid
    actors = [_register(_masquerade(None, str(marker)), "mallory"),
              _register(_masquerade(_description(cluster, tmp_path, "trudy"), str(marker)), "trudy"),
              _register(_masquerade(_description(cluster, tmp_path, "liar", "x86_64/A Faster CPU/64c/avx512f"),
                                    str(marker)), "liar")]
    server = build_server(cluster.settings(tmp_path / "home"))

    async def body() -> None:
        async with Client(server) as client:
            listed = (await client.call_tool("list_devices", {})).structured_content
            assert listed is not None
            devices = {d["id"] for d in listed["devices"]}
            assert {"c@alpha", "c@beta", "c@trudy"} <= devices and not {"c@mallory", "c@liar"} & devices
            warnings = "\n".join(listed["warnings"])
            assert "device/mallory/c is not offered" in warnings and "not a kope message" in warnings
            assert "device/liar/c is not offered" in warnings and "does not follow from its own" in warnings
            # This test's node runs as this test's user: the server says what that leaves open.
            assert "runs as the server's own user, so anyone with the cluster token can run code here" in warnings
            result = await client.call_tool("compile_kernel", {"task_id": "relu", "device": "c@trudy",
                                                               "source": "void relu(void) {}"})
            assert result.is_error
            text = result.content[0].text  # type: ignore[union-attr]
            assert text.startswith("device_lost: device c@trudy answered with something that is not a kope result")

    try:
        anyio.run(body)
    finally:
        for actor in actors:
            ray.kill(actor)
    assert not marker.exists(), f"code ran in processes {_pids(marker)} (this test is {os.getpid()})"


def test_an_actor_of_a_foreign_class_is_never_loaded_by_the_servers_driver(cluster, tmp_path):
    import ray

    marker = tmp_path / "ran"
    tmp_path.chmod(0o777)
    actor = _register(_foreign(str(marker)), "eve")
    hosting = _pids(marker)  # the worker that hosts it loaded its class: that is the attacker's own process
    bench = Workbench(cluster.settings(tmp_path / "home"))
    try:
        assert bench.cluster is not None
        listed = bench.list_devices()
        driver = bench.cluster.link._process.pid
        assert "c@eve" not in {d.id for d in listed.devices} and "c@alpha" in {d.id for d in listed.devices}
        assert any("device/eve/c is not offered: its class is kope_spy_nowhere.Spy" in w for w in listed.warnings)
        time.sleep(1.0)  # an unpickle in flight would have written by now
        assert _pids(marker) - hosting == set(), f"code ran in the driver child {driver} or the server {os.getpid()}"
    finally:
        ray.kill(actor)
        if bench.cluster is not None:
            bench.cluster.close()
        bench.store.close()
