"""The server's side of the cluster: which devices the workers offer, and a Target for each that forwards the
contract's calls to its actor. Every wait is bounded; a device that stops answering is a ``device_lost`` error for
the call that was waiting (nothing of it is recorded as a result) and leaves the roster until it answers again.
Ray itself runs in a child process (``driver.py``): a head that goes away ends that child, never the server.
Nothing from that child or from a worker is unpickled here: every message is read as ``wire`` data of the type the
call expects, and a device whose answer is anything else is refused like one that is lost."""

from __future__ import annotations

import itertools
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kope_mcp.cluster import wire
from kope_mcp.cluster.config import (
    ClusterConfig,
    ClusterSettingError,
    device_id,
    driver_identity,
    node_socket,
    token_path,
    token_source,
)
from kope_mcp.cluster.device_actor import CALLS, DeviceDescription, TaskBundle
from kope_mcp.cluster.driver import PIPE_LIMIT, Lost, Reply, Request
from kope_mcp.errors import DeviceLostError, KopeError
from kope_mcp.hardware import HardwareProfile
from kope_mcp.targets.base import CompileOptions, Measurement, Target, TargetStatus
from kope_mcp.targets.builds import BuildResult
from kope_mcp.targets.native_runner import HarnessOutcome, PreparedCase

if TYPE_CHECKING:
    from kope_mcp.models import CostCounts
    from kope_mcp.settings import KopeSettings
    from kope_mcp.tasks.loader import Task

log = logging.getLogger(__name__)


class RemoteTarget(Target):
    """A device on another node. What depends only on the backend (signatures, baselines, flag rules) is answered
    by a local instance of the same target class; the rest goes to the device's actor."""

    name = "remote"
    language = "remote"
    source_kind = "a kernel source"

    def __init__(self, settings: KopeSettings, local: Target, link: DriverLink, actor: str,
                 described: DeviceDescription, config: ClusterConfig, on_lost: Any) -> None:
        super().__init__(settings)
        self.local, self.link, self.actor, self.described = local, link, actor, described
        self.config, self.on_lost = config, on_lost
        self.device = device_id(described.backend, described.worker)

    # --- what depends on the backend alone: the server's own copy of the target ---------------------------------
    def signature(self, task: Task) -> str | None:
        return self.local.signature(task)

    def baseline_source(self, task: Task) -> str | None:
        return self.local.baseline_source(task)

    def rules(self, task: Task) -> list[str]:
        return self.local.rules(task)

    def default_flags(self) -> list[str]:
        return self.local.default_flags()

    def check_flags(self, flags: list[str], options: CompileOptions) -> None:
        self.local.check_flags(flags, options)

    # --- the device -------------------------------------------------------------------------------------------
    def status(self) -> TargetStatus:
        return self.described.status

    def hardware(self) -> HardwareProfile:
        return self.described.hardware

    def roofline(self) -> HardwareProfile | None:
        return self.described.roofline

    def _call(self, what: str, method: str, timeout_s: float, *args: Any) -> Any:
        try:
            answer = self.link.call(Request(id=0, op="call", actor=self.actor, method=method, timeout_s=timeout_s,
                                            payload=wire.encode(list(args))), timeout_s + 30)
            return wire.decode(answer.payload, CALLS[method][1])
        except (Lost, wire.WireError, wire.RemoteFailure) as exc:
            self.on_lost(self.device)
            how = "was lost" if isinstance(exc, Lost) else "answered with something that is not a kope result"
            raise DeviceLostError(f"device {self.device} {how} during {what} ({str(exc)[:300]}); nothing of this "
                                  "call was recorded (list_devices shows what is available)") from None

    def compile(self, task: Task, source: str, flags: list[str], options: CompileOptions) -> BuildResult:
        return self._call("compile_kernel", "compile", self.settings.compile_timeout_s + self.config.call_margin_s,
                          TaskBundle.of(task), source, flags, options)

    def check_build(self, build_hash: str) -> None:
        self._call("the build check", "check_build", self.config.describe_timeout_s + 10, build_hash)

    def run_cases(self, task: Task, build_hash: str, cases: list[PreparedCase], *, wall_s: float) -> HarnessOutcome:
        return self._call("run_tests", "run_cases", wall_s + self.config.call_margin_s, TaskBundle.of(task),
                          build_hash, cases, wall_s)

    def profile(self, task: Task, build_hash: str, sets: list[PreparedCase], *, with_reference: bool,
                time_cap_s: float, consistency: tuple[float, float], wall_s: float) -> Measurement:
        measured: Measurement = self._call("profile_kernel", "profile", wall_s + self.config.call_margin_s,
                                           TaskBundle.of(task), build_hash, sets, with_reference, time_cap_s,
                                           consistency, wall_s)
        if self.described.niceness > 0:
            measured.warnings.append(f"device {self.device} runs kernels at nice {self.described.niceness}: other "
                                     "work on that machine takes the CPU first (start its worker with `kope worker`, "
                                     "which sets RAY_worker_niceness=0)")
        return measured

    def deterministic_costs(self, task: Task, build_hash: str, case: PreparedCase) -> CostCounts | str:
        result: CostCounts | str = self._call("the deterministic count", "deterministic_costs",
                                              self.settings.test_timeout_s * 20 + self.config.call_margin_s,
                                              TaskBundle.of(task), build_hash, case)
        return result


class TokenProblem(ConnectionError):
    """The cluster token is missing, readable by others, or not the one the cluster was started with."""


# What Ray's client logs, once a second for about 20 s before it gives up, when the head refuses its token.
TOKEN_REFUSED = ("InvalidAuthToken", "Authentication token is missing or incorrect")


class DriverLink:
    """The server's end of the pipe to the Ray driver child (started on first use, again after it ended)."""

    def __init__(self, config: ClusterConfig, home: Path) -> None:
        self.config, self.home = config, home
        self.warning = ""  # what the driver child's identity leaves open (list_devices says it)
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._process: Any = None
        self._conn: Any = None
        self._pending: dict[int, tuple[Any, Future[Reply]]] = {}  # by request: its pipe, its answer
        self._ids = itertools.count()

    def _alive(self) -> bool:
        return self._process is not None and self._process.poll() is None and self._conn is not None

    def _start(self) -> None:
        """Start the child and wait (bounded) until it has joined the cluster; raise ConnectionError otherwise."""
        try:
            token = token_path(self.config.token)  # read at each start: a token fixed on disk needs no restart
        except ClusterSettingError as exc:
            raise TokenProblem(str(exc)) from None
        host, _, port = self.config.address.rpartition(":")
        try:  # Ray retries an absent head for a minute before it gives up: ask the port first
            socket.create_connection((host, int(port)), timeout=5).close()
        except (OSError, ValueError) as exc:
            raise ConnectionError(f"nothing answers at {self.config.address} "
                                  f"({exc.strerror if isinstance(exc, OSError) and exc.strerror else exc})") from None
        # A plain child process on one end of a socket pair, not multiprocessing's spawn: that would run the
        # server's own __main__ again in the child.
        ours_sock, theirs_sock = socket.socketpair()
        identity = driver_identity(node_socket(), os.geteuid(), self.home)
        self.warning = identity.warning
        process = subprocess.Popen(
            identity.command([sys.executable, "-m", "kope_mcp.cluster.driver", self.config.address,
                              str(self.config.describe_timeout_s), str(theirs_sock.fileno())]),
            pass_fds=[theirs_sock.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, env=identity.environment(token, dict(os.environ)), cwd="/",
            start_new_session=True)
        theirs_sock.close()
        refused = threading.Event()
        threading.Thread(target=_watch_stderr, args=(process, refused), name="kope-cluster-stderr",
                         daemon=True).start()
        ours = Connection(ours_sock.detach())
        deadline = time.monotonic() + self.config.connect_timeout_s
        while not ours.poll(0.1):
            if refused.is_set():
                process.kill()
                _, named_by = token_source(self.config.token)
                raise TokenProblem(f"the head at {self.config.address} refused this server's cluster token {token} "
                                   f"({named_by}): it is not the token the cluster was started with (the head's "
                                   "RAY_AUTH_TOKEN_PATH); copy that file here, mode 0600")
            if process.poll() is not None and not ours.poll(0.2):
                break  # it ended without a word: read below as such
            if time.monotonic() > deadline:
                process.kill()
                raise ConnectionError(f"the head at {self.config.address} did not accept this server within "
                                      f"{self.config.connect_timeout_s:g} s")
        try:
            first = wire.decode(ours.recv_bytes(PIPE_LIMIT), Reply)
            kind, message = first.kind, first.message
        except (EOFError, OSError):
            kind, message = "error", f"its driver process exited with code {process.poll()}"
            if identity.uid is not None:
                message += (f" (it runs as uid {identity.uid}, the user of this machine's Ray node, who must be able "
                            "to run this server's Python and kope_mcp)")
        except wire.WireError as exc:
            kind, message = "error", f"its driver process said something unreadable ({exc})"
        if kind != "ready":
            process.kill()
            raise ConnectionError(str(message))
        self._process, self._conn = process, ours
        threading.Thread(target=self._read, args=(ours,), name="kope-cluster-replies", daemon=True).start()

    def _read(self, conn: Any) -> None:
        while True:
            try:
                answer = wire.decode(conn.recv_bytes(PIPE_LIMIT), Reply)
            except (EOFError, OSError):
                break
            except wire.WireError as exc:  # a driver that says nonsense is ended like one that died
                log.warning("the cluster driver sent an unreadable message (%s); restarting it", exc)
                with self._lock:
                    if self._process is not None and self._conn is conn:
                        self._process.kill()
                break
            entry = self._pending.pop(answer.id, None)
            if entry is not None:
                entry[1].set_result(answer)
        with self._lock:  # the child ended (its head went away, or it was killed): its waiting calls are lost
            if self._conn is conn:
                self._conn = None
            waiting = [r for r, (sent_on, _) in self._pending.items() if sent_on is conn]
            futures = [self._pending.pop(r)[1] for r in waiting]
        for future in futures:
            future.set_result(Reply(id=-1, kind="lost", message="the connection to the cluster ended"))

    def reset(self) -> None:
        """End a driver child that is of no more use (its cluster went away and another answers at the address):
        the next call starts a new one."""
        with self._lock:
            if self._process is not None:
                self._process.kill()

    def close(self) -> None:
        """End the driver child (it leaves the cluster as its pipe closes; killed if it does not within 10 s)."""
        with self._lock:
            conn, process = self._conn, self._process
            self._conn = self._process = None
        if conn is not None:
            conn.close()
        if process is not None:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def call(self, request: Request, timeout_s: float, reset_on_timeout: bool = False) -> Reply:
        """Ask the driver (``request.id`` is set here); raise ``Lost`` when the answer does not come.
        ``reset_on_timeout``: a driver that cannot answer this (a listing, never long) is stuck on a head that went
        away; it is ended, and the next call starts another (which fails fast while nothing answers there)."""
        with self._lock:
            if not self._alive():
                if self._process is not None:
                    self._process.kill()
                    self._process.wait()
                self._start()
            request.id = next(self._ids)
            future: Future[Reply] = Future()
            conn = self._conn
            self._pending[request.id] = (conn, future)
        try:
            data = wire.encode(request)
            with self._send_lock:
                conn.send_bytes(data)
        except (OSError, ValueError) as exc:
            self._pending.pop(request.id, None)
            raise Lost(f"the connection to the cluster failed: {exc}") from None
        try:
            answer = future.result(timeout=timeout_s)
        except FutureTimeout:
            self._pending.pop(request.id, None)
            if reset_on_timeout:
                with self._lock:
                    if self._process is not None and self._conn is conn:
                        self._process.kill()
            raise Lost(f"no answer within {timeout_s:.0f} s") from None
        if answer.kind == "ok":
            return answer
        if answer.kind == "lost":
            raise Lost(answer.message)
        raise wire.RemoteFailure(answer.message or f"the cluster's driver answered {answer.kind!r}")


def _watch_stderr(process: Any, refused: threading.Event) -> None:
    """Drain the driver child's stderr (Ray's own log lines, kept at debug level) and flag a refused token."""
    for raw in process.stderr:
        line = raw.decode(errors="replace").rstrip()
        if any(sign in line for sign in TOKEN_REFUSED):
            refused.set()
        log.debug("cluster driver: %s", line[:400])


class ClusterRoster:
    """The devices of a Ray cluster's `kope worker`s, re-read at most every ``roster_ttl_s``."""

    def __init__(self, settings: KopeSettings, config: ClusterConfig, local: dict[str, Target]) -> None:
        self.settings, self.config, self.local = settings, config, local
        self.link = DriverLink(config, settings.home)
        self._lock = threading.Lock()
        self._devices: dict[str, RemoteTarget] = {}
        self._read_at = -1e9
        self.refused: dict[str, str] = {}  # actors in the cluster's namespace that are not offered, and why
        self._failure: str | None = None  # why the cluster could not be used at the last try
        self._retry_at = 0.0
        self._backoff_s = config.backoff_s

    def lost(self, device: str) -> None:
        with self._lock:
            self._devices.pop(device, None)

    def close(self) -> None:
        with self._lock:
            self._devices = {}
        self.link.close()

    def devices(self, refresh: bool = False) -> dict[str, RemoteTarget]:
        """The cluster's devices; DeviceLostError at once while the cluster cannot be used (a refused or missing
        token, a head that does not answer), tried again with a backoff rather than on every call."""
        with self._lock:
            now = time.monotonic()
            if self._failure is not None and now < self._retry_at:
                raise DeviceLostError(f"{self._failure}; this server's own backends still work (list_devices); "
                                      f"the cluster is tried again in {self._retry_at - now:.0f} s")
            if refresh or self._failure is not None or now - self._read_at >= self.config.roster_ttl_s:
                try:
                    self._devices = self._read()
                except (Lost, ConnectionError, wire.RemoteFailure) as exc:
                    where = f"the cluster at {self.config.address}"
                    if isinstance(exc, wire.RemoteFailure):
                        # The driver's cluster is not this address's any more (a head that restarted): a new driver
                        # joins the new one, at once rather than after the backoff.
                        self.link.reset()
                        why, wait_s = f"{where} changed under this server ({exc}); joining it again", 1.0
                    else:
                        why = f"{where} cannot be used: {exc}" if isinstance(exc, TokenProblem) else \
                            f"{where} did not answer ({exc})"
                        wait_s, self._backoff_s = self._backoff_s, min(self._backoff_s * 2, self.config.backoff_max_s)
                    if why != self._failure:
                        log.warning("%s", why)
                    self._failure, self._devices, self._retry_at = why, {}, time.monotonic() + wait_s
                    raise DeviceLostError(f"{why}; this server's own backends still work (list_devices)") from None
                if self._failure is not None:
                    log.warning("the cluster at %s answers again", self.config.address)
                self._failure, self._backoff_s = None, self.config.backoff_s
                self._read_at = time.monotonic()
            return dict(self._devices)

    def _read(self) -> dict[str, RemoteTarget]:
        found: dict[str, RemoteTarget] = {}
        answer = self.link.call(Request(id=0, op="devices"), self.config.describe_timeout_s + 5,
                                reset_on_timeout=True)
        refused = dict(answer.refused)
        for actor, payload in answer.devices.items():
            try:
                described = wire.decode(payload, DeviceDescription)
            except (wire.WireError, wire.RemoteFailure, KopeError) as exc:
                refused[actor] = f"its description is not a kope device's ({str(exc)[:200]})"
                continue
            local = self.local.get(described.backend)
            if local is None:
                refused[actor] = f"it offers backend {described.backend[:40]!r}, which this server does not have"
                continue
            expected = local.hardware_key(described.hardware)
            if described.hardware.key != expected:
                # The key is what the memory ranks by: it must follow from the facts the actor measured.
                refused[actor] = (f"its hardware key {described.hardware.key[:120]!r} does not follow from its own "
                                  f"description (that gives {expected[:120]!r})")
                continue
            cls = type(f"Remote{type(local).__name__}", (RemoteTarget,),
                       {"name": local.name, "language": local.language, "source_kind": local.source_kind,
                        "draws_cases": local.draws_cases})
            target = cls(self.settings, local, self.link, actor, described, self.config, self.lost)
            found[target.device] = target
        for actor, why in refused.items():
            if self.refused.get(actor) != why:
                log.warning("cluster actor %s is left out: %s", actor, why)
        self.refused = {name[:120]: why[:400] for name, why in refused.items()}
        return found


def cluster_roster(settings: KopeSettings, local: dict[str, Target]) -> ClusterRoster:
    """The roster of ``settings.cluster``. A token problem never stops the server: its own devices work, and every
    call that needs the cluster says what is wrong with the token (checked at each connection, with a backoff)."""
    roster = ClusterRoster(settings, ClusterConfig(address=settings.cluster, token=settings.cluster_token), local)
    try:
        token_path(settings.cluster_token)
    except ClusterSettingError as exc:
        log.warning("the cluster at %s cannot be used until this is fixed: %s", settings.cluster, exc)
    return roster
