"""``kope worker``: this machine joins a Ray cluster as a node and offers one device actor per local backend that can
time kernels here (this CPU's C compiler; a GPU backend where a GPU is usable)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kope_mcp.cluster import wire
from kope_mcp.cluster.config import (
    NAMESPACE,
    NODE_RESOURCE,
    ClusterSettingError,
    actor_name,
    apply_ray_environment,
    device_id,
    ray_environment,
)
from kope_mcp.cluster.device_actor import DeviceActor, DeviceDescription
from kope_mcp.settings import KopeSettings
from kope_mcp.targets.base import Target
from kope_mcp.targets.registry import load_targets

log = logging.getLogger(__name__)
READY_TIMEOUT_S = 90.0


def node_resources(worker: str, settings: KopeSettings, backends: list[str]) -> dict[str, float]:
    """What the node advertises: its worker's name (where its actors go), and each backend and hardware key it
    offers, so Ray-level placement and `ray status` can see what the machine has."""
    targets = load_targets(settings)
    resources = {NODE_RESOURCE.format(name=worker): 1.0}
    for backend in backends:
        resources[f"kope-backend:{backend}"] = 1.0
        key = re.sub(r"[^A-Za-z0-9_./()+-]", "_", targets[backend].hardware().key)
        resources[f"kope-hw:{key}"] = 1.0
    return resources


def usable_backends(settings: KopeSettings) -> list[str]:
    """The backends that can time kernels on this machine: a device that can only compile is of no use to others."""
    return [name for name, target in sorted(load_targets(settings).items()) if target.status().profile]


def start_devices(worker: str, home: Path, backends: list[str],
                  target_classes: dict[str, type[Target]] | None = None) -> list[str]:
    """Create (or replace) this worker's device actors on its node, from a connected driver; their device ids once
    each has answered. ``target_classes`` supplies a target by class instead of by registered name."""
    import ray

    remote_cls: Any = ray.remote(DeviceActor)
    created = []
    for backend in backends:
        name = actor_name(worker, backend)
        with contextlib.suppress(ValueError):  # a worker that comes back replaces its old actor
            ray.kill(ray.get_actor(name, namespace=NAMESPACE))
        actor = remote_cls.options(
            # Compiles and tests run beside a profile, as on a server's own device; profiles take the actor's
            # lock, so they never overlap on the device, whichever server sent them.
            name=name, namespace=NAMESPACE, lifetime="detached", num_cpus=0, max_restarts=0, max_concurrency=4,
            resources={NODE_RESOURCE.format(name=worker): 0.001},
        ).remote(worker, backend, str(home), (target_classes or {}).get(backend))
        created.append(actor)
    for actor in created:
        wire.decode(ray.get(actor.describe.remote(), timeout=READY_TIMEOUT_S), DeviceDescription)
    return [device_id(b, worker) for b in backends]


def stop_devices(worker: str, backends: list[str]) -> None:
    import ray

    for backend in backends:
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(actor_name(worker, backend), namespace=NAMESPACE))


def run_worker(address: str, worker: str, home: Path, token: Path, backends: list[str] | None = None) -> int:
    """Join ``address`` as a node, offer the devices, and serve until SIGTERM/SIGINT or the node ends."""
    settings = KopeSettings.from_env(home=home, embeddings=False)
    settings.ensure_home()
    wanted = backends if backends is not None else usable_backends(settings)
    if not wanted:
        raise ClusterSettingError("no backend can time kernels on this machine (`kope doctor` says why)")
    env = {**os.environ, **ray_environment(token)}
    ray_cli = Path(sys.executable).with_name("ray")
    node = subprocess.Popen(
        [str(ray_cli), "start", "--address", address, "--block", "--disable-usage-stats",
         "--resources", json.dumps(node_resources(worker, settings, wanted))],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    try:
        apply_ray_environment(token)  # before ray's first import: it reads its authentication settings then
        import ray

        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING,
                 configure_logging=False)
        # After ray.init, which installs its own SIGTERM handler (exit at once, the devices left behind).
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        deadline = time.monotonic() + READY_TIMEOUT_S
        resource = NODE_RESOURCE.format(name=worker)
        while not any(n["Alive"] and resource in n["Resources"] for n in ray.nodes()):
            if node.poll() is not None or time.monotonic() > deadline:
                err = node.stderr.read().decode(errors="replace")[-800:] if node.stderr else ""
                print(f"kope worker: this machine did not join {address} as a node: {err.strip()}", file=sys.stderr)
                return 1
            time.sleep(0.5)
        devices = start_devices(worker, settings.home, wanted)
        print(f"kope worker {worker}: serving {', '.join(devices)} on {address}", flush=True)
        while not stopping and node.poll() is None:
            time.sleep(0.5)
        stop_devices(worker, wanted)
        return 0 if stopping else 1
    finally:
        if node.poll() is None:
            os.killpg(node.pid, signal.SIGTERM)
            try:
                node.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()
