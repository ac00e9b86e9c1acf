"""``kope worker``: this machine joins a Ray cluster as a node and offers one device actor per local backend that can
time kernels here (this CPU's C compiler; a GPU backend where a GPU is usable).

`kope worker` itself never imports Ray: it supervises two children, the node (`ray start --block`) and the device
process (``python -m kope_mcp.cluster.worker``, a Ray driver that starts the device actors and withdraws them). A
Ray driver whose head goes away is ended by Ray a minute later; the supervisor outlives that, waits until the head
answers again, and joins it afresh, so a restarted head gets its devices back without anyone touching the workers.
The children die with the supervisor (a parent-death signal; the device process then ends the node's process
group), so a killed `kope worker` leaves no devices behind. Node starts on one machine take turns (a file lock):
Ray picks its ports before binding them, and two nodes started at the same moment raced for the same one.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import logging
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kope_mcp.cluster import wire
from kope_mcp.cluster.config import (
    NAMESPACE,
    NODE_RESOURCE,
    ClusterSettingError,
    actor_name,
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


# How the supervisor watches the head: a port probe every HEAD_PROBE_S; HEAD_LOST_AFTER failures in a row and it
# rejoins (the node and the device process of a head that restarted would otherwise take a minute to notice).
HEAD_PROBE_S = 2.0
HEAD_LOST_AFTER = 3
REJOIN_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)
# The device process checks that its node is still in the cluster this often.
NODE_CHECK_S = 5.0
START_LOCK = Path(tempfile.gettempdir()) / "kope-ray-node-start.lock"
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """preexec_fn: this child gets SIGTERM when the supervisor ends, however it ends (SIGKILL included)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def head_answers(address: str, timeout_s: float = 2.0) -> bool:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
        return True
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def start_turn(timeout_s: float = READY_TIMEOUT_S * 2) -> Iterator[None]:
    """This machine's node starts one at a time (bounded: a holder that hangs does not stop the others)."""
    fd = os.open(START_LOCK, os.O_RDONLY | os.O_CREAT, 0o644)  # flock needs no write access: any user can share it
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break  # go ahead: a retry below covers a port race
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)


class _Stop:
    def __init__(self) -> None:
        self.asked = False

    def __call__(self, *_: object) -> None:
        self.asked = True

    def sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.asked and time.monotonic() < deadline:
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


def run_worker(address: str, worker: str, home: Path, token: Path, backends: list[str] | None = None) -> int:
    """Offer this machine's devices on ``address`` until SIGTERM/SIGINT, joining again whenever the head comes back.
    1 when the first join fails for a reason a retry will not mend (the head refused the node)."""
    settings = KopeSettings.from_env(home=home, embeddings=False)
    settings.ensure_home()
    wanted = backends if backends is not None else usable_backends(settings)
    if not wanted:
        raise ClusterSettingError("no backend can time kernels on this machine (`kope doctor` says why)")
    stop = _Stop()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    logs = settings.home / "worker"
    logs.mkdir(parents=True, exist_ok=True, mode=0o700)
    served, tries, waiting_said = False, 0, False
    while not stop.asked:
        if not head_answers(address):
            if not waiting_said:
                print(f"kope worker {worker}: waiting for the head at {address} to answer", file=sys.stderr,
                      flush=True)
                waiting_said = True
            stop.sleep(HEAD_PROBE_S)
            continue
        waiting_said = False
        joined, why = _serve_once(address, worker, settings, token, wanted, logs, stop)
        if stop.asked:
            break
        if not joined and any(sign in why for sign in ("InvalidAuthToken", "Authentication token")):
            print(f"kope worker: the head at {address} refused this machine's cluster token {token}: it is not the "
                  "token the cluster was started with (the head's RAY_AUTH_TOKEN_PATH)", file=sys.stderr, flush=True)
            return 1
        if not joined and not served and "Address already in use" not in why and tries >= 2:
            print(f"kope worker: this machine did not join {address} as a node: {why}", file=sys.stderr, flush=True)
            return 1
        served = served or joined
        delay = REJOIN_BACKOFF_S[min(tries, len(REJOIN_BACKOFF_S) - 1)]
        tries = 0 if joined else tries + 1
        print(f"kope worker {worker}: {why}; joining {address} again when it answers", file=sys.stderr, flush=True)
        stop.sleep(delay)
    return 0


def _serve_once(address: str, worker: str, settings: KopeSettings, token: Path, wanted: list[str], logs: Path,
                stop: _Stop) -> tuple[bool, str]:
    """One life of the node and the device process: (whether the devices were offered, why it ended)."""
    env = {**os.environ, **ray_environment(token)}
    ray_cli = Path(sys.executable).with_name("ray")
    node_log = logs / f"{worker}-node.log"
    node = child = None
    ready_r, ready_w = os.pipe()
    try:
        with start_turn(), node_log.open("wb") as node_err:
            node = subprocess.Popen(
                [str(ray_cli), "start", "--address", address, "--block", "--disable-usage-stats",
                 "--resources", json.dumps(node_resources(worker, settings, wanted))],
                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=node_err,
                start_new_session=True, preexec_fn=_die_with_parent)
            child = subprocess.Popen(
                [sys.executable, "-m", "kope_mcp.cluster.worker", address, worker, str(settings.home),
                 ",".join(wanted), str(node.pid), str(ready_w)],
                env=env, stdin=subprocess.DEVNULL, pass_fds=[ready_w], preexec_fn=_die_with_parent)
            os.close(ready_w)
            ready_w = -1
            said = _read_line(ready_r, READY_TIMEOUT_S + 30, stop)
        if not said.startswith("ready "):
            tail = node_log.read_text(errors="replace").strip()[-600:] if node_log.exists() else ""
            return False, (said or "the node did not join") + (f" ({tail})" if tail else "")
        print(f"kope worker {worker}: serving {said[6:]} on {address}", flush=True)
        misses = 0
        while not stop.asked:
            stop.sleep(HEAD_PROBE_S)
            if node.poll() is not None:
                return True, "its Ray node ended"
            if child.poll() is not None:
                return True, f"its device process ended (exit {child.returncode})"
            misses = 0 if head_answers(address) else misses + 1
            if misses >= HEAD_LOST_AFTER:
                return True, "the head stopped answering"
        return True, "asked to stop"
    finally:
        os.close(ready_r)
        if ready_w >= 0:
            os.close(ready_w)
        # Asked to stop: the devices are withdrawn first. Otherwise the cluster is gone or going: nothing to tell it.
        _end(child, node, graceful=stop.asked)


def _read_line(fd: int, timeout_s: float, stop: _Stop) -> str:
    deadline, data = time.monotonic() + timeout_s, b""
    while not stop.asked and time.monotonic() < deadline and not data.endswith(b"\n"):
        readable, _, _ = select.select([fd], [], [], 0.5)
        if readable:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    return data.decode(errors="replace").strip()


def _end(child: subprocess.Popen[bytes] | None, node: subprocess.Popen[bytes] | None, graceful: bool) -> None:
    """The device process withdraws the devices (SIGTERM; killed when not ``graceful``), then the node's whole
    process group goes."""
    if child is not None and child.poll() is None:
        child.send_signal(signal.SIGTERM if graceful else signal.SIGKILL)
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    if node is not None:
        with contextlib.suppress(ProcessLookupError):
            # `ray start --block` takes up to half a minute over a SIGTERM; a node whose head is gone is killed.
            os.killpg(node.pid, signal.SIGTERM if graceful else signal.SIGKILL)
        try:
            node.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGKILL)
            node.wait()


def serve_devices(address: str, worker: str, home: Path, wanted: list[str], node_pid: int, ready_fd: int) -> int:
    """The device process: a Ray driver that waits for its node, starts the devices, says so on ``ready_fd``, and
    withdraws them on SIGTERM (its supervisor's, or the parent-death signal) or when the node leaves the cluster."""
    supervisor = os.getppid()
    stop = _Stop()
    signal.signal(signal.SIGTERM, stop)
    import ray

    def tell(text: str) -> None:
        with contextlib.suppress(OSError):
            os.write(ready_fd, (text.replace("\n", " ")[:1000] + "\n").encode())

    try:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING,
                 configure_logging=False)
        # After ray.init, which installs its own SIGTERM handler (exit at once, the devices left behind).
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        deadline = time.monotonic() + READY_TIMEOUT_S
        resource = NODE_RESOURCE.format(name=worker)
        while not any(n["Alive"] and resource in n["Resources"] for n in ray.nodes()):
            if stop.asked or time.monotonic() > deadline:
                tell("the node did not join within the time allowed")
                return 3
            time.sleep(0.5)
        devices = start_devices(worker, home, wanted)
    except Exception as exc:  # told to the supervisor, which retries or reports it
        tell(f"{type(exc).__name__}: {wire.first_line(exc)}")
        return 3
    tell("ready " + ", ".join(devices))
    checked, missed = time.monotonic(), 0
    while not stop.asked and os.getppid() == supervisor:
        time.sleep(0.5)
        if time.monotonic() - checked >= NODE_CHECK_S:
            checked = time.monotonic()
            missed = 0 if _node_alive(ray, resource) else missed + 1
            if missed >= 2:
                return 4  # the cluster lost this node (a head that restarted): the supervisor joins again
    done = threading.Thread(target=stop_devices, args=(worker, wanted), daemon=True)
    done.start()
    done.join(10)
    if os.getppid() != supervisor:  # the supervisor is gone: nobody else will end the node
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node_pid, signal.SIGTERM)
    return 0


def _node_alive(ray: Any, resource: str) -> bool:
    answer: list[bool] = []

    def ask() -> None:
        with contextlib.suppress(Exception):
            answer.append(any(n["Alive"] and resource in n["Resources"] for n in ray.nodes()))

    asking = threading.Thread(target=ask, daemon=True)
    asking.start()
    asking.join(10)
    return bool(answer and answer[0])


if __name__ == "__main__":
    address_arg, worker_arg, home_arg, wanted_arg, node_arg, fd_arg = sys.argv[1:7]
    os._exit(serve_devices(address_arg, worker_arg, Path(home_arg), wanted_arg.split(","), int(node_arg),
                           int(fd_arg)))
