"""The server's Ray driver, in a child process of its own.

A Ray driver whose head goes away waits 60 s and then terminates its process: in the server that would take the
memory, the local devices and every client with it. So the server never imports Ray; this child does, and talks to
the server over a pipe. Requests are answered concurrently (a profile on one device does not hold up a compile on
another); the child exits when the server goes away, and the server starts a new one when the old one has ended.

Whoever holds the cluster token can register an actor, so nothing a worker sends is run here: a device's answers
are fetched as raw bytes (never deserialized; anything but a ``bytes`` return is refused unread), only actors of
kope's own ``DeviceActor`` class are loaded (Ray would otherwise unpickle a foreign actor's class from the cluster
to make its handle), and everything on the pipe is a ``wire`` message, in both directions.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from kope_mcp.cluster import wire
from kope_mcp.cluster.config import NAMESPACE
from kope_mcp.cluster.device_actor import DeviceActor

PIPE_LIMIT = 8 * 1024**3


class Lost(Exception):
    """The device (or the cluster) did not answer: the call's state on it is unknown."""


class Refused(Exception):
    """The device answered with something that is not a kope message, or is not a kope device: nothing of it is
    read."""


@dataclass
class Request:
    id: int
    op: str  # "devices" or "call"
    actor: str = ""
    method: str = ""
    timeout_s: float = 0.0
    payload: bytes = b""


@dataclass
class Reply:
    id: int
    kind: str  # "ok", "lost", "failed", "ready", "error"
    message: str = ""
    payload: bytes = b""
    # "devices": every device that answered, with its description (a wire message), and the actors left out.
    devices: dict[str, bytes] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)


def serve(conn: Connection, address: str, describe_timeout_s: float) -> None:
    """The child's life: join the cluster (its environment carries Ray's settings and the token), then answer
    requests until the pipe closes."""
    try:
        import ray

        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING,
                 configure_logging=False)
        _only_device_actors(ray)
    except BaseException as exc:  # the server reports it; nothing else can be done here
        message = f"{type(exc).__name__}: {wire.first_line(exc)}"
        conn.send_bytes(wire.encode(Reply(id=-1, kind="error", message=message)))
        os._exit(1)
    conn.send_bytes(wire.encode(Reply(id=-1, kind="ready")))
    handles: dict[str, Any] = {}
    send_lock = threading.Lock()

    def reply(answer: Reply) -> None:
        data = wire.encode(answer)
        with send_lock:
            conn.send_bytes(data)

    def handle(request: Request) -> None:
        try:
            if request.op == "devices":
                found, refused = _devices(ray, handles, describe_timeout_s)
                reply(Reply(id=request.id, kind="ok", devices=found, refused=refused))
            else:
                reply(Reply(id=request.id, kind="ok", payload=_call(ray, handles, request)))
        except Lost as exc:
            reply(Reply(id=request.id, kind="lost", message=str(exc)))
        except Exception as exc:
            reply(Reply(id=request.id, kind="failed", message=f"{type(exc).__name__}: {wire.first_line(exc)}"))

    pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="kope-cluster-call")
    while True:
        try:
            request = wire.decode(conn.recv_bytes(PIPE_LIMIT), Request)
        except (EOFError, OSError, wire.WireError):
            os._exit(0)  # the server is gone (or is not a server)
        pool.submit(handle, request)


def _only_device_actors(ray: Any) -> None:
    """Make an actor handle only for kope's own DeviceActor class, loaded from this install's code. Ray would load
    any other class from the cluster, where whoever registered it put a pickle of their choosing."""
    manager = ray._private.worker.global_worker.function_actor_manager
    ours = (DeviceActor.__module__, DeviceActor.__qualname__)

    def load_actor_class(job_id: Any, descriptor: Any) -> Any:
        if (descriptor.module_name, descriptor.class_name) != ours:
            raise Refused(f"its class is {descriptor.module_name[:80]}.{descriptor.class_name[:80]}, "
                          "not kope's DeviceActor")
        return modified

    modified = ray.actor._modify_class(DeviceActor)
    manager.load_actor_class = load_actor_class


def _handle(ray: Any, handles: dict[str, Any], name: str) -> Any:
    if name not in handles:
        try:
            handles[name] = ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            raise Lost("it is no longer in the cluster") from None
    return handles[name]


def _devices(ray: Any, handles: dict[str, Any], timeout_s: float) -> tuple[dict[str, bytes], dict[str, str]]:
    """Each device that answers within ``timeout_s``, with its description; the actors left out, with why."""
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a.get("namespace") == NAMESPACE and a["name"].startswith("device/")]
    for name in list(handles):
        if name not in names:
            del handles[name]  # gone: a worker that comes back gets a new handle
    refs, refused = {}, {}
    for name in names:
        try:
            refs[_handle(ray, handles, name).describe.remote()] = name
        except Lost:
            continue
        except Refused as exc:
            refused[name] = str(exc)
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    found = {}
    for ref in ready:
        try:
            found[refs[ref]] = _fetch(ray, ref, 0.0)
        except Refused as exc:
            refused[refs[ref]] = str(exc)
        except Exception:  # a dead or broken worker is left out of the roster, not fatal to it
            handles.pop(refs[ref], None)
    return found, refused


def _call(ray: Any, handles: dict[str, Any], request: Request) -> bytes:
    ref = _handle(ray, handles, request.actor).call.remote(request.method, request.payload)
    try:
        return _fetch(ray, ref, request.timeout_s)
    except Lost:
        handles.pop(request.actor, None)
        raise


def _fetch(ray: Any, ref: Any, timeout_s: float) -> bytes:
    """The answer behind ``ref`` as the bytes its writer stored, read without deserializing anything: Ray's own
    ``get`` would unpickle whatever the worker chose to store."""
    from ray import exceptions
    from ray._private import ray_constants
    from ray.core.generated.common_pb2 import ErrorType  # type: ignore[attr-defined]

    try:
        (data, metadata, *_), = ray._private.worker.global_worker.core_worker.get_objects(
            [ref], int(timeout_s * 1000))
    except exceptions.GetTimeoutError:
        ray.cancel(ref)
        raise Lost(f"it did not finish within {timeout_s:.0f} s") from None
    except (exceptions.RayActorError, exceptions.ActorUnavailableError, exceptions.RaySystemError) as exc:
        raise Lost(lost_reason(type(exc).__name__, str(exc))) from None
    tag = bytes(metadata or b"").split(b",")[0]
    if tag == ray_constants.OBJECT_METADATA_TYPE_RAW:
        return bytes(data) if data is not None else b""
    if tag.isdigit():
        error = int(tag)
        if error == ErrorType.Value("TASK_EXECUTION_EXCEPTION"):
            raise Refused("the device raised instead of answering (its error was not read)")
        name = ErrorType.Name(error) if error in ErrorType.values() else str(error)
        raise Lost(lost_reason(name, ""))
    raise Refused(f"it answered with a {tag.decode(errors='replace')[:20] or 'untyped'} object, not a kope message "
                  "(it was not read)")


OOM = ("the node ran short of memory and Ray's memory monitor ended the device's work (it does above "
       "RAY_memory_usage_threshold, 95% of the machine's memory by default)")


def lost_reason(kind: str, detail: str) -> str:
    """Why a device's call was lost, in one line: Ray's error type (an ErrorType name, or an exception's) and
    its text; an out-of-memory kill is said as such."""
    said = (detail.strip().splitlines() or [""])[0][:200]
    if kind == "OUT_OF_MEMORY" or "OutOfMemory" in kind or "memory monitor" in detail or "OOM" in detail:
        return OOM
    return said or kind.lower().replace("_", " ")


if __name__ == "__main__":
    import sys

    address, describe_timeout, fd = sys.argv[1:4]
    serve(Connection(int(fd)), address, float(describe_timeout))
