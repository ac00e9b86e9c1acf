"""A task's inputs and reference outputs: in this process for the package's own tasks, in the sandbox for any other.

A task folder added with `kope tasks add`, imported from KernelBench or found on KOPE_TASKS_PATH is someone else's
Python: its reference.py (and a KernelBench problem it loads) runs only in the sandbox kernels run in
(:mod:`kope_mcp.app.reference_worker`), and what comes back is data, checked against task.toml (every argument, its
dtype and shape) before anything uses it. A failure there is the task's: ``invalid_task`` with what it raised.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from kope_mcp.errors import InvalidTaskError
from kope_mcp.runtime.sandbox import (
    SandboxLimits,
    SandboxResult,
    SandboxUnavailable,
    Scratch,
    memory_file,
    run_sandboxed,
    scrubbed_env,
)
from kope_mcp.runtime.worker_formats import REFERENCE_MAGIC as MAGIC
from kope_mcp.settings import KopeSettings
from kope_mcp.targets.native_runner import python_runtime
from kope_mcp.tasks.loader import REFERENCE_FILE, Task
from kope_mcp.tasks.spec import CaseSpec

# What one sandboxed run may hand back (the profile pool's budget is 64 MiB of inputs, outputs in float64).
RESULT_CAP_BYTES = 1024**3
SANDBOX_TASK = "/kope/task"
# A KernelBench reference imports torch (seconds) before its first case.
WALL_S = 180.0


@dataclass(frozen=True)
class CaseData:
    inputs: dict[str, np.ndarray]
    expected: list[np.ndarray]


@dataclass(frozen=True)
class PoolRule:
    min: int
    max: int
    pool_bytes: int
    time_budget_s: float


class ReferenceRunner:
    def __init__(self, settings: KopeSettings) -> None:
        self.settings = settings

    def cases(self, task: Task, items: list[tuple[CaseSpec, int]]) -> list[CaseData]:
        """Inputs (seeded) and expected outputs for each (case, seed)."""
        if task.trusted:
            out = []
            for case, seed in items:
                inputs = task.case_inputs(case, seed)
                out.append(CaseData(inputs, task.run_reference(inputs, case.sizes)))
            return out
        job = {"requests": [{"case": case.model_dump(mode="json"), "seed": seed} for case, seed in items]}
        return self._sandboxed(task, job, [case for case, _ in items])

    def pool(self, task: Task, case: CaseSpec, seed: int, rule: PoolRule) -> list[CaseData]:
        """Sets ``seed``, ``seed + 1``, ... of ``case``, as many as ``rule`` allows after timing the first."""
        job = {"pool": {"case": case.model_dump(mode="json"), "seed": seed, "rule": rule.__dict__}}
        found = self._sandboxed(task, job, None, pool_case=case)
        if not rule.min <= len(found) <= rule.max:
            raise InvalidTaskError(f"{task.folder / REFERENCE_FILE}: the sandboxed reference made {len(found)} "
                                   f"input sets; between {rule.min} and {rule.max} were asked for")
        return found

    def _sandboxed(self, task: Task, job: dict[str, Any], cases: list[CaseSpec] | None, *,
                   pool_case: CaseSpec | None = None) -> list[CaseData]:
        result_fd = memory_file("reference")
        try:
            with Scratch(self.settings.scratch_dir) as scratch:
                job["task_folder"] = scratch.place(task.folder.resolve(), SANDBOX_TASK)
                try:
                    run = run_worker(scratch, "kope_mcp.app.reference_worker", job, result_fd, SandboxLimits(
                        wall_seconds=WALL_S, cpu_seconds=int(WALL_S) * (os.cpu_count() or 1),
                        address_space_bytes=self.settings.memory_limit_bytes, max_file_bytes=RESULT_CAP_BYTES))
                except SandboxUnavailable as exc:
                    raise InvalidTaskError(f"{task.folder}: this task's reference.py is not the package's and runs "
                                           f"only in the sandbox, which this machine lacks: {exc}") from None
            arrays, manifest = _mapped(result_fd)
        finally:
            os.close(result_fd)
        where = task.folder / REFERENCE_FILE
        if manifest is None:
            tail = run.stderr_tail.strip()[-600:]
            raise InvalidTaskError(f"{where}: the reference's sandboxed run {run.describe()} without a result"
                                   + (f": {tail}" if tail else ""))
        if not isinstance(manifest, dict) or "error" in manifest:
            said = str(manifest.get("error") if isinstance(manifest, dict) else "a malformed result")[:800]
            # Told in the folder's own terms: the path the user knows, one error code.
            raise InvalidTaskError(said.removeprefix(f"{InvalidTaskError.code}: ").replace(SANDBOX_TASK,
                                                                                          str(task.folder)))
        results = manifest.get("results")
        if not isinstance(results, list) or (cases is not None and len(results) != len(cases)):
            raise InvalidTaskError(f"{where}: the sandboxed reference answered {len(results or [])} requests")
        out = []
        for index, _ in enumerate(results):
            case = cases[index] if cases is not None else pool_case
            assert case is not None
            out.append(_checked(task, case, arrays, index))
        return out


def run_worker(scratch: Scratch, module: str, job: dict[str, Any], result_fd: int,
               limits: SandboxLimits) -> SandboxResult:
    """``python -m module JOB`` in the sandbox with this interpreter and package; the job (with ``result_fd``, the
    one descriptor it may write its answer to) goes in as a read-only file."""
    runtime = python_runtime()
    job_path = scratch.inputs / "job.json"
    job_path.write_text(json.dumps({**job, "result_fd": result_fd}))
    job_path.chmod(0o644)
    env = scrubbed_env({"PYTHONPATH": runtime.place(scratch), "PYTHONDONTWRITEBYTECODE": "1"},
                       tmpdir=scratch.inside(scratch.run))
    return run_sandboxed([runtime.executable, "-S", "-B", "-m", module, scratch.inside(job_path)],
                         scratch=scratch, env=env, pass_fds=(result_fd,), limits=limits)


def _mapped(fd: int) -> tuple[dict[str, np.ndarray], dict[str, Any] | None]:
    """The worker's arrays, read in place from the result file (read-only views), and its manifest; (.., None)
    when the file is not a whole result."""
    size = os.fstat(fd).st_size
    trailer = len(MAGIC) + 8
    if size < trailer or size > RESULT_CAP_BYTES:
        return {}, None
    view = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    if view[size - len(MAGIC):] != MAGIC:
        return {}, None
    (length,) = struct.unpack("<Q", view[size - trailer:size - len(MAGIC)])
    if length > min(size - trailer, 16 * 1024**2):
        return {}, None
    try:
        manifest = json.loads(view[size - trailer - length:size - trailer])
        arrays = {}
        for entry in manifest.get("arrays", []) if isinstance(manifest, dict) else []:
            dtype = np.dtype(str(entry["dtype"]))
            shape = tuple(int(n) for n in entry["shape"])
            offset, nbytes = int(entry["offset"]), int(entry["nbytes"])
            count = int(np.prod(shape)) if shape else 1
            if dtype.hasobject or offset < 0 or nbytes != count * dtype.itemsize or offset + nbytes > size - trailer:
                return {}, None
            arrays[str(entry["key"])] = np.frombuffer(view, dtype, count, offset).reshape(shape)
    except (ValueError, TypeError, KeyError, UnicodeDecodeError):
        return {}, None
    return arrays, manifest


def _checked(task: Task, case: CaseSpec, archive: dict[str, np.ndarray], index: int) -> CaseData:
    """One request's arrays, each exactly what task.toml declares (read-only views of the result file)."""
    where = task.folder / REFERENCE_FILE
    inputs: dict[str, np.ndarray] = {}
    for arg in task.spec.args:
        if arg.kind != "in":
            continue
        key = f"{index}/in/{arg.name}"
        if key not in archive:
            raise InvalidTaskError(f"{where}: case {case.name!r}: no input {arg.name!r} came back")
        arr = archive[key]
        shape = tuple(task.spec.shape_of(arg, case.sizes))
        if arr.dtype != np.dtype(arg.dtype) or arr.shape != shape:
            raise InvalidTaskError(f"{where}: case {case.name!r}: input {arg.name!r} is {arr.dtype} {arr.shape}; "
                                   f"task.toml says {arg.dtype} {shape}")
        inputs[arg.name] = arr
    expected = []
    for k, arg in enumerate(task.outputs()):
        key = f"{index}/out/{k}"
        if key not in archive:
            raise InvalidTaskError(f"{where}: case {case.name!r}: reference() returned no output {arg.name!r}")
        arr = archive[key]
        shape = tuple(task.spec.shape_of(arg, case.sizes))
        if arr.dtype != np.float64 or arr.shape != shape:
            raise InvalidTaskError(f"{where}: case {case.name!r}: output {arg.name!r} came back {arr.dtype} "
                                   f"{arr.shape}; expected float64 {shape}")
        expected.append(arr)
    return CaseData(inputs, expected)

