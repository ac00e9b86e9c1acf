"""The server's side of the cluster: which devices the workers offer, and a Target for each that forwards the
contract's calls to its actor. Every wait is bounded; a device that stops answering is a ``device_lost`` error for
the call that was waiting (nothing of it is recorded as a result) and leaves the roster until it answers again."""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from kope_mcp.cluster.config import NAMESPACE, ClusterConfig, apply_ray_environment, device_id, token_path
from kope_mcp.cluster.device_actor import DeviceDescription, TaskBundle
from kope_mcp.errors import DeviceLostError
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

    def __init__(self, settings: KopeSettings, local: Target, actor: Any, described: DeviceDescription,
                 config: ClusterConfig, on_lost: Any) -> None:
        super().__init__(settings)
        self.local, self.actor, self.described, self.config, self.on_lost = local, actor, described, config, on_lost
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
        import ray
        from ray import exceptions

        ref = getattr(self.actor, method).remote(*args)
        try:
            return ray.get(ref, timeout=timeout_s)
        except exceptions.GetTimeoutError:
            ray.cancel(ref)
            self.on_lost(self.device)
            raise DeviceLostError(f"device {self.device} did not finish {what} within {timeout_s:.0f} s; nothing of "
                                  "this call was recorded (list_devices shows what is available)") from None
        except exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, Exception):
                raise cause from None  # the contract's own outcome (a refused flag, a tampered build), as if local
            raise
        except (exceptions.RayActorError, exceptions.ActorUnavailableError, exceptions.RaySystemError) as exc:
            self.on_lost(self.device)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise DeviceLostError(f"device {self.device} was lost during {what} ({first}); nothing of this call "
                                  "was recorded (list_devices shows what is available)") from None

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


class ClusterRoster:
    """The devices of a Ray cluster's `kope worker`s, re-read at most every ``roster_ttl_s``."""

    def __init__(self, settings: KopeSettings, config: ClusterConfig, local: dict[str, Target]) -> None:
        self.settings, self.config, self.local = settings, config, local
        self._lock = threading.Lock()
        self._connected = False
        self._joining: tuple[threading.Thread, dict[str, BaseException]] | None = None
        self._devices: dict[str, RemoteTarget] = {}
        self._read_at = -1e9

    def _connect(self) -> None:
        """Join the cluster as a driver, within ``connect_timeout_s``: Ray itself retries an absent head forever."""
        if self._connected:
            return
        # Before ray's first import in this process: it reads its authentication settings then.
        if self.config.token_file is not None:
            apply_ray_environment(self.config.token_file)
        host, _, port = self.config.address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except (OSError, ValueError) as exc:
            raise ConnectionError(f"nothing answers at {self.config.address} "
                                  f"({exc.strerror if isinstance(exc, OSError) and exc.strerror else exc})") from None
        import ray

        if ray.is_initialized():  # this process already drives the cluster (a test, or `kope worker` itself)
            self._connected = True
            return
        if self._joining is None:
            outcome: dict[str, BaseException] = {}

            def join() -> None:
                try:
                    ray.init(address=self.config.address, namespace=NAMESPACE, log_to_driver=False,
                             logging_level=logging.WARNING, configure_logging=False)
                except BaseException as exc:  # handed to the waiting call
                    outcome["error"] = exc

            thread = threading.Thread(target=join, name="kope-cluster-join", daemon=True)
            thread.start()
            self._joining = (thread, outcome)
        thread, outcome = self._joining
        thread.join(self.config.connect_timeout_s)
        if thread.is_alive():
            raise ConnectionError(f"the head at {self.config.address} did not accept this server within "
                                  f"{self.config.connect_timeout_s:g} s (is KOPE_CLUSTER_TOKEN the cluster's token?)")
        self._joining = None
        if "error" in outcome:
            raise outcome["error"]
        self._connected = True

    def lost(self, device: str) -> None:
        with self._lock:
            self._devices.pop(device, None)

    def devices(self, refresh: bool = False) -> dict[str, RemoteTarget]:
        with self._lock:
            if refresh or time.monotonic() - self._read_at >= self.config.roster_ttl_s:
                try:
                    self._devices = self._read()
                except Exception as exc:
                    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
                    raise DeviceLostError(f"the cluster at {self.config.address} did not answer ({first}); this "
                                          "server's own backends still work (list_devices)") from exc
                self._read_at = time.monotonic()
            return dict(self._devices)

    def _read(self) -> dict[str, RemoteTarget]:
        self._connect()  # first: ray must not be imported before its authentication settings are in place
        import ray

        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                 if a.get("namespace") == NAMESPACE and a["name"].startswith("device/")]
        actors: dict[str, Any] = {}
        for name in names:
            try:
                actors[name] = ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:
                continue  # gone since it was listed
        refs = {actor.describe.remote(): name for name, actor in actors.items()}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=self.config.describe_timeout_s)
        found: dict[str, RemoteTarget] = {}
        for ref in ready:
            try:
                described: DeviceDescription = ray.get(ref, timeout=0)
            except Exception as exc:  # a dead or broken worker is left out, not fatal to the roster
                log.info("device %s did not describe itself: %s", refs[ref], exc)
                continue
            local = self.local.get(described.backend)
            if local is None:
                log.warning("device %s offers backend %r, which this server does not have", refs[ref],
                            described.backend)
                continue
            cls = type(f"Remote{type(local).__name__}", (RemoteTarget,),
                       {"name": local.name, "language": local.language, "source_kind": local.source_kind,
                        "draws_cases": local.draws_cases})
            target = cls(self.settings, local, actors[refs[ref]], described, self.config, self.lost)
            found[target.device] = target
        return found


def cluster_roster(settings: KopeSettings, local: dict[str, Target]) -> ClusterRoster:
    """The roster of ``settings.cluster``; refuses a missing or readable token before anything connects."""
    config = ClusterConfig(address=settings.cluster, token_file=token_path(settings.cluster_token))
    return ClusterRoster(settings, config, local)
