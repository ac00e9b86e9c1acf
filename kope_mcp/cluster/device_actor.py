"""One device of a worker machine, as a Ray actor: the unchanged target contract run locally, in the same sandbox.

It holds a local target (the C compiler and this CPU; a GPU target where one is usable) and answers the contract's
calls with verdict data only: builds stay here (run_tests and profile_kernel follow the build), outputs and
corroborated timings go back to the server, which judges them against references it computed itself. The actor
never sees the memory or the server's token; a task reaches it as the files of its folder, loaded untrusted (its
reference runs only inside the sandbox, as on the server).

Everything it receives and answers is a ``wire`` message (plain data with a schema): a Ray return value that is
``bytes`` travels raw, and the server's driver reads nothing else, so no answer of a worker is ever unpickled there.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kope_mcp.cluster import wire
from kope_mcp.hardware import HardwareProfile
from kope_mcp.models import CostCounts
from kope_mcp.settings import KopeSettings
from kope_mcp.targets.base import CompileOptions, Measurement, Target, TargetStatus
from kope_mcp.targets.builds import BuildResult
from kope_mcp.targets.native_runner import HarnessOutcome, PreparedCase
from kope_mcp.targets.registry import load_targets
from kope_mcp.tasks.loader import Task, load_task

TASK_FILES_LIMIT = 4 * 1024**2


@dataclass(frozen=True)
class TaskBundle:
    """A task folder's files, as the server has them: what the worker builds and runs against."""

    task_id: str
    files: dict[str, bytes]

    @classmethod
    def of(cls, task: Task) -> TaskBundle:
        files = {p.relative_to(task.folder).as_posix(): p.read_bytes() for p in sorted(task.folder.rglob("*"))
                 if p.is_file() and "__pycache__" not in p.parts}
        if sum(len(b) for b in files.values()) > TASK_FILES_LIMIT:
            raise ValueError(f"task {task.id}'s folder is over {TASK_FILES_LIMIT >> 20} MiB")
        return cls(task_id=task.id, files=files)

    def digest(self) -> str:
        h = hashlib.sha256(self.task_id.encode())
        for name, data in sorted(self.files.items()):
            h.update(f"\0{name}\0{len(data)}\0".encode())
            h.update(data)
        return h.hexdigest()[:24]


@dataclass(frozen=True)
class DeviceDescription:
    worker: str
    backend: str
    host: str
    status: TargetStatus
    hardware: HardwareProfile
    roofline: HardwareProfile | None
    niceness: int


# Each call of the contract: the types of its arguments and of its answer, as both ends read them.
CALLS: dict[str, tuple[Any, Any]] = {
    "compile": (tuple[TaskBundle, str, list[str], CompileOptions], BuildResult),
    "check_build": (tuple[str], type(None)),
    "run_cases": (tuple[TaskBundle, str, list[PreparedCase], float], HarnessOutcome),
    "profile": (tuple[TaskBundle, str, list[PreparedCase], bool, float, tuple[float, float], float], Measurement),
    "deterministic_costs": (tuple[TaskBundle, str, PreparedCase], CostCounts | str),
}


class DeviceActor:
    """Created by ``kope worker`` (as a detached, named Ray actor on its own node) for one local backend."""

    def __init__(self, worker: str, backend: str, home: str, target_class: type[Target] | None = None) -> None:
        # Ray starts workers at nice 15 unless the node was started with RAY_worker_niceness=0; a sandbox inherits
        # it. Try to undo it (root can); what is left is reported, and the server warns with every profile.
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, 0)
        self.worker, self.backend = worker, backend
        self.settings = KopeSettings.from_env(home=Path(home), embeddings=False)
        self.settings.ensure_home()
        # ``target_class``: a target this package does not register (tools/bench_cluster.py's waiting one).
        targets = {backend: target_class(self.settings)} if target_class is not None else load_targets(self.settings)
        if backend not in targets:
            raise ValueError(f"no backend {backend!r} on worker {worker}; here: {', '.join(sorted(targets))}")
        self.target: Target = targets[backend]
        self.tasks: dict[str, Task] = {}
        self._tasks_lock = threading.Lock()
        self._profile_lock = threading.Lock()

    def _task(self, bundle: TaskBundle) -> Task:
        key = bundle.digest()
        with self._tasks_lock:
            return self._materialised(key, bundle)

    def _materialised(self, key: str, bundle: TaskBundle) -> Task:
        if key not in self.tasks:
            folder = self.settings.home / "cluster-tasks" / key / bundle.task_id
            if not (folder / "task.toml").is_file():
                # Readable by the sandbox's run uid, as the server's task folders are (the home around it is 0700).
                folder.mkdir(parents=True, exist_ok=True)
                for name, data in bundle.files.items():
                    path = (folder / name).resolve()
                    if folder.resolve() not in path.parents:
                        raise ValueError(f"task file {name!r} is outside its folder")
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.parent.chmod(0o755)
                    path.write_bytes(data)
                    path.chmod(0o644)
                folder.chmod(0o755)
            self.tasks[key] = load_task(folder, trusted=False)
        return self.tasks[key]

    # --- what Ray calls: wire messages in and out ------------------------------------------------------------
    def describe(self) -> bytes:
        try:
            return wire.encode(self.description())
        except Exception as exc:  # an answer, never a pickled exception
            return wire.encode_error(exc)

    def call(self, method: str, payload: bytes) -> bytes:
        try:
            if method not in CALLS:
                raise ValueError(f"no call {method!r}")
            arguments, _ = CALLS[method]
            return wire.encode(getattr(self, method)(*wire.decode(payload, arguments)))
        except Exception as exc:
            return wire.encode_error(exc)

    # --- the contract, call for call -------------------------------------------------------------------------
    def description(self) -> DeviceDescription:
        return DeviceDescription(worker=self.worker, backend=self.backend, host=socket.gethostname(),
                                 status=self.target.status(), hardware=self.target.hardware(),
                                 roofline=self.target.roofline(), niceness=os.getpriority(os.PRIO_PROCESS, 0))

    def compile(self, bundle: TaskBundle, source: str, flags: list[str], options: CompileOptions) -> BuildResult:
        build = self.target.compile(self._task(bundle), source, flags, options)
        build.artifact = None  # a path on this machine: the build is reached through this actor, never by path
        return build

    def check_build(self, build_hash: str) -> None:
        self.target.check_build(build_hash)

    def run_cases(self, bundle: TaskBundle, build_hash: str, cases: list[PreparedCase],
                  wall_s: float) -> HarnessOutcome:
        return self.target.run_cases(self._task(bundle), build_hash, cases, wall_s=wall_s)

    def profile(self, bundle: TaskBundle, build_hash: str, sets: list[PreparedCase], with_reference: bool,
                time_cap_s: float, consistency: tuple[float, float], wall_s: float) -> Measurement:
        task = self._task(bundle)
        with self._profile_lock:
            return self.target.profile(task, build_hash, sets, with_reference=with_reference,
                                       time_cap_s=time_cap_s, consistency=consistency, wall_s=wall_s)

    def deterministic_costs(self, bundle: TaskBundle, build_hash: str, case: PreparedCase) -> Any:
        return self.target.deterministic_costs(self._task(bundle), build_hash, case)
