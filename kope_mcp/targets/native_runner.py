"""Parent side of the harness: prepare a job, run it in the sandbox, read back what the child reported.

Used by every backend whose build product is a shared library exporting a C-ABI ``kernel``. The job and its
inputs are written into the scratch's read-only ``in/``; the child reports only through descriptors opened here
(a memory file for outputs and the JSON trailer, one for progress markers, a pipe to the timekeeper). Nothing
is read back from the folder the sandbox can write.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

import kope_mcp
from kope_mcp.runtime import sandbox_seccomp, variants
from kope_mcp.runtime.harness import TRAILER_MAGIC
from kope_mcp.runtime.sandbox import (
    SandboxLimits,
    SandboxResult,
    Scratch,
    capabilities,
    memory_file,
    read_memory_file,
    run_sandboxed,
    scrubbed_env,
)
from kope_mcp.runtime.sandbox_gpu import GpuBinding
from kope_mcp.targets.timing import CorroboratedTimings, TimingUnverified, corroborate, parse_stamps
from kope_mcp.tasks.loader import Task

# A GPU run's host allocations (RLIMIT_DATA), in multiples of the server's memory limit: each profile worker holds
# its input sets on the host too, and the CUDA runtime and torch allocate besides.
GPU_DATA_FACTOR = 2
Status = Literal["ok", "crash", "timeout", "fork", "load_error", "unverified", "tampered", "device_unavailable",
                 "baseline_failed"]
_TRAILER_CAP = 4 * 1024**2
MIN_ROUNDS = 7
_PROGRESS_CAP = 64 * 1024


@dataclass
class PreparedCase:
    name: str
    sizes: dict[str, int]
    inputs: dict[str, np.ndarray]


@dataclass
class HarnessOutcome:
    status: Status
    message: str = ""
    failed_case: str | None = None
    result: dict[str, Any] = field(default_factory=dict)
    outputs: list[dict[str, np.ndarray]] = field(default_factory=list)
    timings: CorroboratedTimings | None = None
    stdout_tail: str = ""
    stderr_tail: str = ""
    uid: int | None = None
    # A profile's variants (runtime/variants.py): the seed the server drew (None: off), and the (set, variant)
    # of each variant call whose outputs follow the anchors' in ``outputs``.
    variant_seed: int | None = None
    variants: list[tuple[int, int]] = field(default_factory=list)


@dataclass(frozen=True)
class PythonRuntime:
    """The interpreter and the libraries the harness imports, as real host paths.

    The interpreter and its standard library are bound at their own paths (an interpreter finds its prefix from
    where it runs, and pyenv's links libpython by absolute path); ``kope_mcp`` and the site-packages folders are
    bound under ``/kope/py`` so a run learns nothing of where the server's checkout or venv lives.
    """

    executable: str
    interpreter: tuple[Path, ...]
    package: Path
    site: tuple[Path, ...]

    def place(self, scratch: Scratch) -> str:
        """Bind everything into the run; the PYTHONPATH to use there."""
        for path in self.interpreter:
            scratch.place(path)
        entries = [str(Path(scratch.place(self.package, "/kope/py/pkg/kope_mcp")).parent)]
        entries += [scratch.place(path, f"/kope/py/site{i}") for i, path in enumerate(self.site)]
        return os.pathsep.join(entries)


@functools.cache
def python_runtime() -> PythonRuntime:
    exe = Path(os.path.realpath(sys.executable))
    package = Path(kope_mcp.__file__).resolve().parent
    # The folders this process imports its libraries from (numpy; torch for a KernelBench reference): every
    # site-packages on sys.path, and numpy's own wherever it is. Not the rest of sys.path (a test runner puts
    # the whole checkout there).
    wanted = [p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))]
    wanted.append(str(Path(np.__file__).resolve().parent.parent))
    site = tuple(dict.fromkeys(Path(p).resolve() for p in wanted if os.path.isdir(p)))
    return PythonRuntime(str(exe), tuple(dict.fromkeys([Path(sys.base_prefix).resolve(), exe.parent])), package,
                         site)


def _write_cases(task: Task, cases: list[PreparedCase], folder: Path,
                 data_fd: int | None = None) -> list[dict[str, Any]]:
    """The cases' specs; their inputs as files of ``folder`` (a test run's: the kernel may see them), or at offsets
    of ``data_fd`` (a profile's pool: a descriptor the coordinator closes before the candidate could open it)."""
    specs = []
    offset = 0
    for index, case in enumerate(cases):
        inputs = {}
        for name, arr in case.inputs.items():
            data = np.ascontiguousarray(arr)
            meta: dict[str, Any] = {"dtype": str(arr.dtype), "shape": list(arr.shape)}
            if data_fd is not None:
                meta["offset"] = offset
                view = data.reshape(-1).view(np.uint8).data
                done = 0
                while done < len(view):
                    done += os.pwrite(data_fd, view[done:], offset + done)
                offset += data.nbytes
            else:
                file = f"in_{index}_{name}.bin"
                data.tofile(folder / file)
                (folder / file).chmod(0o644)
                meta["file"] = file
            inputs[name] = meta
        outputs = {
            a.name: {"dtype": a.dtype, "shape": list(task.spec.shape_of(a, case.sizes))} for a in task.outputs()
        }
        scalars = {a.name: a.value for a in task.spec.args if a.kind == "scalar"}
        specs.append({"name": case.name, "sizes": case.sizes, "inputs": inputs, "outputs": outputs,
                      "scalars": scalars})
    return specs


def _progress_lines(fd: int) -> list[str]:
    return read_memory_file(fd, _PROGRESS_CAP).decode("utf-8", errors="replace").splitlines()


def _classify_death(run: SandboxResult, progress: list[str], *,
                    profile: bool = False) -> tuple[Status, str, str | None]:
    # A profile's coordinator marks which implementation it resumed for each batch ("run NAME"); its workers
    # cannot write to this descriptor, so a run that ends while a trusted one runs is not the candidate's doing. A
    # test run's kernel shares its process with the descriptor: no such line of it is believed.
    runs = [line.split(" ", 1)[1] for line in progress if line.startswith("run ")] if profile else []
    progress = [line for line in progress if not line.startswith("run ")]
    if runs and runs[-1] != "candidate" and run.timed_out:
        return "baseline_failed", f"the {runs[-1]} was {run.describe()} during the profile", None
    last = progress[-1].split(" ", 2) if progress else []
    running = last[2] if len(last) == 3 and last[0] == "start" else (last[0] if last and last[0] in
                                                                       ("warmup", "measure") else None)
    where = f" while running case {running!r}" if running and len(last) == 3 else ""
    if run.timed_out:
        return "timeout", f"the kernel was {run.describe()}{where}", running
    if run.signal_number is None and last and last[0] == "start":
        return "crash", (f"the process {run.describe()}{where}: the kernel ended the process "
                         "(exit() or similar) instead of returning"), running
    return "crash", f"the kernel process {run.describe()}{where}", running


class TrailerError(Exception):
    pass


def _split_result(data: bytes) -> tuple[bytes, dict[str, Any]]:
    """Raw output bytes and the JSON trailer; raises TrailerError when the child left no valid one."""
    if len(data) < 16 or data[-8:] != TRAILER_MAGIC:
        raise TrailerError("the harness wrote no result")
    (length,) = struct.unpack("<Q", data[-16:-8])
    if length > min(_TRAILER_CAP, len(data) - 16):
        raise TrailerError("the result trailer is malformed")
    try:
        trailer = json.loads(data[-16 - length:-16])
    except (UnicodeDecodeError, ValueError) as exc:
        raise TrailerError("the result trailer is not JSON") from exc
    if not isinstance(trailer, dict):
        raise TrailerError("the result trailer is not an object")
    return data[:-16 - length], trailer


def checked_variants(result: dict[str, Any], count: int) -> list[tuple[int, int]]:
    """The (set, variant) of each variant call whose outputs a profile returned after the anchors'."""
    listed = result.get("checked_variants", [])
    if not isinstance(listed, list) or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, int) for x in p) and 0 <= p[0] < count
            and 0 < p[1] < 1 << 62 for p in listed):
        raise TrailerError("the result's checked variants are malformed")
    return [(int(i), int(v)) for i, v in listed]


def checked_sets(result: dict[str, Any], count: int) -> list[int]:
    """The input sets whose outputs a profile returned, in order (all of them when it does not say)."""
    listed = result.get("checked_sets", list(range(count)))
    if not isinstance(listed, list) or not all(isinstance(i, int) and 0 <= i < count for i in listed) \
            or listed != sorted(set(listed)) or not listed:
        raise TrailerError("the result does not say which input sets it checked")
    return listed


def _unpack_outputs(raw: bytes, task: Task, cases: list[PreparedCase], count: int) -> list[dict[str, np.ndarray]]:
    """Outputs at offsets the parent computes from the task's shapes (never from what the child claims)."""
    outputs: list[dict[str, np.ndarray]] = []
    offset = 0
    for case in cases[:count]:
        loaded = {}
        for a in task.outputs():
            shape = task.spec.shape_of(a, case.sizes)
            nbytes = int(np.prod(shape)) * np.dtype(a.dtype).itemsize
            if offset + nbytes > len(raw):
                raise TrailerError("the result holds fewer output bytes than the cases need")
            loaded[a.name] = np.frombuffer(raw, dtype=a.dtype, count=int(np.prod(shape)), offset=offset).reshape(shape)
            offset += nbytes
        outputs.append(loaded)
    if offset != len(raw):
        raise TrailerError("the result holds more output bytes than the cases need")
    return outputs


class NativeRunner:
    def __init__(self, memory_limit_bytes: int, scratch_root: Path) -> None:
        self.memory_limit_bytes = memory_limit_bytes
        self.scratch_root = scratch_root

    def _run(self, job: dict[str, Any], cases: list[PreparedCase], task: Task, wall_s: float,
             extra_env: dict[str, str], libraries: dict[str, Path], *, timing_cpu: int | None = None,
             harness: str = "kope_mcp.runtime.harness", gpu: GpuBinding | None = None) -> tuple[HarnessOutcome, bytes]:
        runtime = python_runtime()
        result_fd, progress_fd = memory_file("result"), memory_file("progress")
        fds = {"result": result_fd, "progress": progress_fd}
        if job["mode"] == "profile":
            fds["inputs"] = memory_file("inputs")
        timekeeper: subprocess.Popen[bytes] | None = None
        stamps_fd = write_end = ack_read = None
        with Scratch(self.scratch_root) as scratch:
            try:
                job["cases"] = _write_cases(task, cases, scratch.inputs, fds.get("inputs"))
                job["libraries"] = {name: scratch.stage(path, f"/kope/lib/{name}{path.suffix}")
                                    for name, path in libraries.items()}
                if job.get("task_folder"):
                    job["task_folder"] = scratch.place(Path(job["task_folder"]), "/kope/task")
                if job["mode"] == "profile":
                    read_end, write_end = os.pipe()
                    ack_read, ack_write = os.pipe()
                    stamps_fd = memory_file("stamps")
                    timekeeper = subprocess.Popen(
                        [sys.executable, "-S", "-m", "kope_mcp.runtime.timekeeper",
                         str(timing_cpu) if timing_cpu is not None else "-", str(ack_write)],
                        stdin=read_end, stdout=stamps_fd, stderr=subprocess.DEVNULL, pass_fds=(ack_write,),
                        env={"PYTHONPATH": str(runtime.package.parent), "PATH": "/usr/bin:/bin"},
                    )
                    os.close(read_end)
                    os.close(ack_write)
                    fds["timing"], fds["ack"] = write_end, ack_read
                job["fds"] = fds
                # A CPU profile's workers create no process (a GPU's: Triton runs ptxas at its first call).
                worker_filter = sandbox_seccomp.worker_program(spawn=not (job["mode"] == "profile" and gpu is None))
                job["worker_filter"] = worker_filter.hex() if worker_filter else None
                job_path = scratch.inputs / "job.json"
                job_path.write_text(json.dumps(job))
                job_path.chmod(0o644)
                env = scrubbed_env({"PYTHONPATH": runtime.place(scratch), "PYTHONDONTWRITEBYTECODE": "1",
                                    **extra_env, **(gpu.env() if gpu is not None else {})},
                                   tmpdir=scratch.inside(scratch.run))
                env = {k: v.replace("{run}", scratch.inside(scratch.run)) for k, v in env.items()}
                run = run_sandboxed(
                    [runtime.executable, "-S", "-B", "-m", harness, scratch.inside(job_path)],
                    scratch=scratch,
                    limits=self._limits(wall_s, gpu is not None, _result_bytes(task, cases) + (
                        variants.CHECKED * _result_bytes(task, cases[:1]) if job["mode"] == "profile" else 0)),
                    env=env,
                    pass_fds=tuple(fds.values()),
                    reaching=job["mode"] == "profile",  # the coordinator reads the stopped candidate's buffers
                    gpu=gpu,
                    private_run=True,  # nothing of a kernel's run is read back from its folder
                )
                outcome = HarnessOutcome(status="ok", stdout_tail=run.stdout_tail, stderr_tail=run.stderr_tail,
                                         uid=run.uid)
                stamps = ""
                if timekeeper is not None and write_end is not None and stamps_fd is not None:
                    os.close(write_end)
                    write_end = None
                    timekeeper.wait(timeout=30)
                    stamps = read_memory_file(stamps_fd, 64 * 1024**2).decode("ascii", errors="replace")
                try:
                    raw, trailer = _split_result(read_memory_file(result_fd, 1 << 40))
                except TrailerError:
                    outcome.status, outcome.message, outcome.failed_case = _classify_death(
                        run, _progress_lines(progress_fd), profile=job["mode"] == "profile")
                    if run.stderr_tail.strip():
                        outcome.message += f". stderr: {run.stderr_tail.strip()[-800:]}"
                    return outcome, b""
                outcome.result = trailer
                if job["mode"] == "profile":
                    order = [*libraries, *(["reference"] if job.get("task_folder") else [])]
                    self._corroborate(outcome, stamps, order)
                self._fatal(outcome)
                return outcome, raw
            finally:
                for fd in (result_fd, progress_fd, fds.get("inputs"), write_end, stamps_fd, ack_read):
                    if fd is not None:
                        os.close(fd)
                if timekeeper is not None and timekeeper.poll() is None:
                    timekeeper.kill()
                    timekeeper.wait()

    def _limits(self, wall_s: float, gpu: bool, result_bytes: int) -> SandboxLimits:
        cpu = int(wall_s * (os.cpu_count() or 1)) + 5
        # The result descriptor holds every case's (or checked set's) outputs: a GPU size's outputs outgrow the
        # default file-size cap (two 128 MiB sets of vector_add), and a write past it fails with EFBIG.
        files = max(SandboxLimits().max_file_bytes, result_bytes + _TRAILER_CAP + (1 << 20))
        if gpu:
            # The CUDA runtime reserves tens of GiB of address space at start: bound what it allocates instead.
            return SandboxLimits(wall_seconds=wall_s, cpu_seconds=cpu, address_space_bytes=None,
                                 data_bytes=GPU_DATA_FACTOR * self.memory_limit_bytes, max_file_bytes=files)
        return SandboxLimits(wall_seconds=wall_s, cpu_seconds=cpu, address_space_bytes=self.memory_limit_bytes,
                             max_file_bytes=files)

    @staticmethod
    def _corroborate(outcome: HarnessOutcome, stamps: str, order: list[str]) -> None:
        if outcome.result.get("fatal"):
            return
        try:
            outcome.timings = corroborate(parse_stamps(stamps, order), order)
        except TimingUnverified as exc:
            outcome.status = "unverified"
            outcome.message = (f"the measurement could not be corroborated: {exc}. The harness's claims and the "
                               "trusted timekeeper's stamps disagree; nothing was recorded as a speedup")

    @staticmethod
    def _fatal(outcome: HarnessOutcome) -> None:
        fatal = outcome.result.get("fatal")
        if fatal == "fork":
            outcome.status = "fork"
            outcome.failed_case = str(outcome.result.get("case"))
            outcome.message = ("the kernel created a child process (fork/clone); kernels must not start "
                               "processes, use OpenMP threads instead")
        elif fatal == "crash":
            outcome.status = "crash"
            outcome.message = str(outcome.result.get("message"))[:800]
            outcome.failed_case = str(outcome.result["case"]) if outcome.result.get("case") else None
        elif fatal == "tampered":
            outcome.status = "tampered"
            outcome.message = str(outcome.result.get("message"))[:800]
        elif fatal in ("device_unavailable", "baseline_failed"):
            outcome.status = fatal
            outcome.message = str(outcome.result.get("message"))[:800]
        elif fatal == "load_error":
            outcome.status = "load_error"
            outcome.message = f"the kernel library cannot be loaded: {str(outcome.result.get('message'))[:800]}"

    def run_tests(self, task: Task, library: Path, cases: list[PreparedCase], wall_s: float,
                  openmp: bool, *, harness: str = "kope_mcp.runtime.harness", env: dict[str, str] | None = None,
                  job_extra: dict[str, Any] | None = None, gpu: GpuBinding | None = None) -> HarnessOutcome:
        """Each case once; ``harness`` is the child module (a target's own for a non-C-ABI artifact); ``{run}``
        in an ``env`` value becomes the run's writable folder; ``gpu``: the run is given that GPU."""
        job: dict[str, Any] = {"mode": "test", "args": _args(task), **(job_extra or {})}
        outcome, raw = self._run(job, cases, task, wall_s,
                                 ({} if openmp else {"OMP_NUM_THREADS": "1"}) | (env or {}),
                                 {"candidate": library}, harness=harness, gpu=gpu)
        if outcome.status == "ok":
            try:
                reported = outcome.result.get("cases")
                if not isinstance(reported, list) or len(reported) != len(cases):
                    raise TrailerError("the result does not list every case")
                outcome.outputs = _unpack_outputs(raw, task, cases, len(cases))
            except TrailerError as exc:
                outcome.status, outcome.message = "crash", f"the harness's result is unusable: {exc}"
        return outcome

    def profile(self, task: Task, libraries: dict[str, Path], sets: list[PreparedCase], *, time_cap_s: float,
                with_reference: bool, openmp: bool, pin_cpu: int | None, timing_cpu: int | None, wall_s: float,
                consistency: tuple[float, float]) -> HarnessOutcome:
        job: dict[str, Any] = {
            "mode": "profile",
            "args": _args(task),
            "task_folder": str(task.folder) if with_reference else None,
            "time_cap_s": time_cap_s,
            "pin_cpu": pin_cpu,
            "pid_namespace": capabilities().isolated,
            "consistency_atol": consistency[0],
            "consistency_rtol": consistency[1],
            "min_rounds": MIN_ROUNDS,
            # Repeated calls on variants of their sets, which the server can judge only with a reference of its
            # own (a task's code that must run in the sandbox cannot be called here on the variant).
            "variant_seed": secrets.randbits(62) if task.trusted and task.spec.profile.variants else None,
        }
        env = {"OMP_NUM_THREADS": str(os.cpu_count() or 1) if openmp else "1"}
        if openmp:
            # An OpenMP team that spin-waits after each region holds every CPU and delays the timekeeper's stamp
            # of the batch's end by 1.5-2 ms, so its timings could not be corroborated: the team sleeps instead.
            env["OMP_WAIT_POLICY"] = "passive"
        outcome, raw = self._run(job, sets, task, wall_s, env, libraries, timing_cpu=timing_cpu,
                                 harness="kope_mcp.runtime.harness_profile")
        outcome.variant_seed = job["variant_seed"]
        return _with_checked_outputs(outcome, raw, task, sets)

    def profile_gpu(self, task: Task, libraries: dict[str, Path], sets: list[PreparedCase], *, kind: str,
                    gpu: GpuBinding, time_cap_s: float, wall_s: float, consistency: tuple[float, float],
                    env: dict[str, str]) -> HarnessOutcome:
        """A GPU target's profile (targets/gpu_profile_harness.py): candidate and baseline, each in its own worker
        on the device, through the contract's protocol; timings corroborated by the timekeeper as for C."""
        job: dict[str, Any] = {
            "mode": "profile", "kind": kind, "args": _args(task), "task_folder": None, "time_cap_s": time_cap_s,
            "pid_namespace": capabilities().isolated, "consistency_atol": consistency[0],
            "consistency_rtol": consistency[1], "min_rounds": MIN_ROUNDS, "gpu_minor": gpu.index,
        }
        outcome, raw = self._run(job, sets, task, wall_s, {"OMP_NUM_THREADS": "1", **env}, libraries,
                                 harness="kope_mcp.targets.gpu_profile_harness", gpu=gpu)
        return _with_checked_outputs(outcome, raw, task, sets)


def _with_checked_outputs(outcome: HarnessOutcome, raw: bytes, task: Task, sets: list[PreparedCase]) -> HarnessOutcome:
    """A profile's outcome with the outputs of the sets it checked. Timings that could not be corroborated still
    come with the outputs the coordinator read back: a wrong kernel is then reported as wrong
    (verdicts.profile_failure)."""
    if outcome.status == "ok" or (outcome.status == "unverified" and raw):
        try:
            checked = [sets[i] for i in checked_sets(outcome.result, len(sets))]
            outcome.variants = checked_variants(outcome.result, len(sets)) if outcome.variant_seed is not None else []
            checked += [sets[i] for i, _ in outcome.variants]
            outcome.outputs = _unpack_outputs(raw, task, checked, len(checked))
        except TrailerError as exc:
            if outcome.status == "ok":
                outcome.status, outcome.message = "unverified", f"the harness's result is unusable: {exc}"
    return outcome


def _result_bytes(task: Task, cases: list[PreparedCase]) -> int:
    """The outputs of every case: the most a run's result descriptor must hold."""
    return sum(int(np.prod(task.spec.shape_of(a, case.sizes))) * np.dtype(a.dtype).itemsize
               for case in cases for a in task.outputs())


def _args(task: Task) -> list[dict[str, Any]]:
    return [{"name": a.name, "kind": a.kind, "dtype": a.dtype} for a in task.spec.args]
