"""Parent side of the harness: prepare a job, run it in the sandbox, read back what the child reported.

Used by every backend whose build product is a shared library exporting a C-ABI ``kernel``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

import kope_mcp
from kope_mcp.sandbox import SandboxLimits, SandboxResult, make_private_dir, run_sandboxed, scrubbed_env
from kope_mcp.tasks.loader import Task

Status = Literal["ok", "crash", "timeout", "fork"]


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
    stdout_tail: str = ""
    stderr_tail: str = ""
    privileges_dropped: bool = False


def _package_root() -> str:
    return str(Path(kope_mcp.__file__).resolve().parent.parent)


def _write_cases(task: Task, cases: list[PreparedCase], work: Path) -> list[dict[str, Any]]:
    specs = []
    for index, case in enumerate(cases):
        inputs = {}
        for name, arr in case.inputs.items():
            file = f"in_{index}_{name}.bin"
            np.ascontiguousarray(arr).tofile(work / file)
            (work / file).chmod(0o644)
            inputs[name] = {"file": file, "dtype": str(arr.dtype), "shape": list(arr.shape)}
        outputs = {
            a.name: {"dtype": a.dtype, "shape": list(task.spec.shape_of(a, case.sizes))} for a in task.outputs()
        }
        scalars = {a.name: a.value for a in task.spec.args if a.kind == "scalar"}
        specs.append({"name": case.name, "sizes": case.sizes, "inputs": inputs, "outputs": outputs,
                      "scalars": scalars})
    return specs


def _classify_death(run: SandboxResult, work: Path) -> tuple[Status, str, str | None]:
    progress = (work / "progress.txt").read_text().splitlines() if (work / "progress.txt").is_file() else []
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


class NativeRunner:
    def __init__(self, memory_limit_bytes: int) -> None:
        self.memory_limit_bytes = memory_limit_bytes

    def _run(self, job: dict[str, Any], cases: list[PreparedCase], task: Task, wall_s: float,
             extra_env: dict[str, str]) -> tuple[HarnessOutcome, Path]:
        work = make_private_dir(prefix="kope-run-")
        job["cases"] = _write_cases(task, cases, work)
        (work / "job.json").write_text(json.dumps(job))
        (work / "job.json").chmod(0o644)
        env = scrubbed_env({"PYTHONPATH": _package_root(), "KOPE_SANDBOX_DROP": "1", **extra_env})
        run = run_sandboxed(
            [sys.executable, "-m", "kope_mcp.harness", str(work / "job.json")],
            cwd=work,
            limits=SandboxLimits(wall_seconds=wall_s, cpu_seconds=int(wall_s * (os.cpu_count() or 1)) + 5,
                                 address_space_bytes=self.memory_limit_bytes),
            env=env,
            switch_user=False,  # the harness drops privileges itself once it has loaded the interpreter
        )
        outcome = HarnessOutcome(status="ok", stdout_tail=run.stdout_tail, stderr_tail=run.stderr_tail)
        result_file = work / "result.json"
        if not result_file.is_file():
            outcome.status, outcome.message, outcome.failed_case = _classify_death(run, work)
            if run.stderr_tail.strip():
                outcome.message += f". stderr: {run.stderr_tail.strip()[-800:]}"
            return outcome, work
        outcome.result = json.loads(result_file.read_text())
        outcome.privileges_dropped = bool(outcome.result.get("privileges_dropped"))
        if outcome.result.get("fatal") == "fork":
            outcome.status = "fork"
            outcome.failed_case = outcome.result.get("case")
            outcome.message = ("the kernel created a child process (fork/clone); kernels must not start "
                               "processes, use OpenMP threads instead")
        return outcome, work

    def run_tests(self, task: Task, library: Path, cases: list[PreparedCase], wall_s: float,
                  openmp: bool) -> HarnessOutcome:
        job = {"mode": "test", "libraries": {"candidate": str(library)}, "args": _args(task)}
        outcome, work = self._run(job, cases, task, wall_s, {} if openmp else {"OMP_NUM_THREADS": "1"})
        try:
            if outcome.status == "ok":
                for index, case_result in enumerate(outcome.result["cases"]):
                    loaded = {}
                    for a in task.outputs():
                        shape = task.spec.shape_of(a, cases[index].sizes)
                        loaded[a.name] = np.fromfile(work / case_result["outputs"][a.name],
                                                     dtype=a.dtype).reshape(shape)
                    outcome.outputs.append(loaded)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return outcome

    def profile(self, task: Task, libraries: dict[str, Path], case: PreparedCase, *, time_cap_s: float,
                with_reference: bool, openmp: bool, pin_cpu: int | None, wall_s: float) -> HarnessOutcome:
        job = {
            "mode": "profile",
            "libraries": {name: str(path) for name, path in libraries.items()},
            "args": _args(task),
            "task_folder": str(task.folder) if with_reference else None,
            "time_cap_s": time_cap_s,
            "pin_cpu": pin_cpu,
        }
        env = {"OMP_NUM_THREADS": str(os.cpu_count() or 1) if openmp else "1"}
        outcome, work = self._run(job, [case], task, wall_s, env)
        shutil.rmtree(work, ignore_errors=True)
        return outcome


def _args(task: Task) -> list[dict[str, Any]]:
    return [{"name": a.name, "kind": a.kind, "dtype": a.dtype} for a in task.spec.args]
