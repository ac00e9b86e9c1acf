"""The server's Ray driver, in a child process of its own.

A Ray driver whose head goes away waits 60 s and then terminates its process: in the server that would take the
memory, the local devices and every client with it. So the server never imports Ray; this child does, and talks to
the server over a pipe. Requests are answered concurrently (a profile on one device does not hold up a compile on
another); the child exits when the server goes away, and the server starts a new one when the old one has ended.
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from kope_mcp.cluster.config import NAMESPACE, apply_ray_environment


class Lost(Exception):
    """The device (or the cluster) did not answer: the call's state on it is unknown."""


def serve(conn: Connection, address: str, token: str | None, describe_timeout_s: float) -> None:
    """The child's life: join the cluster, then answer ``(request id, op, args)`` until the pipe closes."""
    try:
        if token:
            apply_ray_environment(Path(token))  # before ray's first import: it reads its auth settings then
        import ray

        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING,
                 configure_logging=False)
    except BaseException as exc:  # the server reports it; nothing else can be done here
        conn.send(("error", f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"))
        os._exit(1)
    conn.send(("ready", None))
    handles: dict[str, Any] = {}
    send_lock = threading.Lock()

    def reply(request: int, kind: str, value: Any) -> None:
        try:
            data = pickle.dumps((request, kind, value))
        except Exception as exc:  # an exception that does not pickle still says what it was
            data = pickle.dumps((request, "failed", f"{type(value).__name__}: {value} ({exc})"))
        with send_lock:
            conn.send_bytes(data)

    def handle(request: int, op: str, args: tuple[Any, ...]) -> None:
        try:
            reply(request, "ok", _devices(ray, handles, describe_timeout_s) if op == "devices" else
                  _call(ray, handles, *args))
        except Lost as exc:
            reply(request, "lost", str(exc))
        except Exception as exc:
            reply(request, "raise", exc)

    pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="kope-cluster-call")
    while True:
        try:
            request, op, args = conn.recv()
        except (EOFError, OSError):
            os._exit(0)  # the server is gone
        pool.submit(handle, request, op, args)


def _handle(ray: Any, handles: dict[str, Any], name: str) -> Any:
    if name not in handles:
        try:
            handles[name] = ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            raise Lost("it is no longer in the cluster") from None
    return handles[name]


def _devices(ray: Any, handles: dict[str, Any], timeout_s: float) -> list[tuple[str, Any]]:
    """(actor name, its DeviceDescription) for every device that answers within ``timeout_s``."""
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a.get("namespace") == NAMESPACE and a["name"].startswith("device/")]
    for name in list(handles):
        if name not in names:
            del handles[name]  # gone: a worker that comes back gets a new handle
    refs = {}
    for name in names:
        try:
            refs[_handle(ray, handles, name).describe.remote()] = name
        except Lost:
            continue
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    found = []
    for ref in ready:
        try:
            found.append((refs[ref], ray.get(ref, timeout=0)))
        except Exception:  # a dead or broken worker is left out of the roster, not fatal to it
            handles.pop(refs[ref], None)
    return found


def _call(ray: Any, handles: dict[str, Any], name: str, method: str, args: tuple[Any, ...], timeout_s: float) -> Any:
    from ray import exceptions

    ref = getattr(_handle(ray, handles, name), method).remote(*args)
    try:
        return ray.get(ref, timeout=timeout_s)
    except exceptions.GetTimeoutError:
        ray.cancel(ref)
        raise Lost(f"it did not finish within {timeout_s:.0f} s") from None
    except exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, Exception):
            raise cause from None  # the contract's own outcome (a tampered build, a bad task), as if local
        raise
    except (exceptions.RayActorError, exceptions.ActorUnavailableError, exceptions.RaySystemError) as exc:
        handles.pop(name, None)
        raise Lost((str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]) from None


if __name__ == "__main__":
    import sys

    address, token, describe_timeout, fd = sys.argv[1:5]
    serve(Connection(int(fd)), address, token or None, float(describe_timeout))
