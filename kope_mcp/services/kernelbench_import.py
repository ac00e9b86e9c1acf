"""`kope tasks import-kernelbench PATH...`: KernelBench problems (a PyTorch Model, get_inputs, get_init_inputs)
become C tasks under KOPE_HOME/tasks.

The scaling rule (also in docs/tasks.md): the problem's module-level integers of 16 or more are its sizes
(smaller ones are kernel sizes, strides, dims and stay as written). All sizes are divided by the same power of
two, 2**k with the smallest k >= 0, until (1) every array of the kernel together holds at most 2**24 elements
and (2) the PyTorch reference (float64, this machine) runs in under 0.1 s (a naive C kernel may be 10-50x
slower than PyTorch's BLAS; the profile must still finish). That is the profiling case.
The correctness cases are smaller derivatives of it (halves, odd and prime-offset sizes, ones, one size
large and the others small), each checked to run; constant extents become literals in the prototype.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from kope_mcp.errors import InvalidTaskError
from kope_mcp.runtime.sandbox import (
    SandboxLimits,
    SandboxUnavailable,
    Scratch,
    memory_file,
    read_memory_file,
)
from kope_mcp.services.references import run_worker
from kope_mcp.services.task_admin import check_task, install_folder, install_target
from kope_mcp.settings import KopeSettings
from kope_mcp.tasks.kernelbench import PROBLEM_FILE, ProblemError
from kope_mcp.tasks.loader import load_task

# Deciding the scale runs the problem many times, after importing torch: minutes at worst on a busy machine.
PLAN_WALL_S = 600.0
_GENERATED = ("task.toml", "reference.py")
_FILE_CAP = 1024**2


class ImportedProblem(BaseModel):
    source: str
    task_id: str
    prototype: str
    scale: str
    profile_sizes: dict[str, int]
    cases: int
    tolerance: float
    installed_at: str
    replaced: bool


class SkippedProblem(BaseModel):
    source: str
    reason: str


class KernelBenchImport(BaseModel):
    imported: list[ImportedProblem]
    skipped: list[SkippedProblem]


def import_kernelbench(settings: KopeSettings, paths: list[Path], replace: bool = False) -> KernelBenchImport:
    """Import every problem file (folders: every *.py inside); a problem that cannot be expressed is skipped
    with the reason, never half-imported."""
    report = KernelBenchImport(imported=[], skipped=[])
    for path in _problem_files(paths):
        try:
            report.imported.append(_import_one(settings, path, replace))
        except (ProblemError, InvalidTaskError) as exc:
            report.skipped.append(SkippedProblem(source=str(path), reason=str(exc)))
    return report


def _problem_files(paths: list[Path]) -> Iterator[Path]:
    for path in paths:
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*.py") if not p.name.startswith("_"))
        else:
            yield path



def _import_one(settings: KopeSettings, path: Path, replace: bool) -> ImportedProblem:
    if not path.is_file():
        raise ProblemError("no such file")
    task_id = "kb_" + (re.sub(r"[^a-z0-9]+", "_", path.stem.lower()).strip("_") or "problem")
    target = install_target(settings, task_id, path, replace)
    planned = _plan_in_sandbox(settings, path, task_id)
    with tempfile.TemporaryDirectory(prefix="kope-kb-import-") as scratch:
        folder = Path(scratch) / task_id
        folder.mkdir()
        shutil.copyfile(path, folder / PROBLEM_FILE)
        for name in _GENERATED:
            (folder / name).write_text(planned["files"][name], encoding="utf-8")
        # Written in the sandbox next to the problem's code: read as a folder from elsewhere, never imported here.
        task = load_task(folder, trusted=False)
        check_task(settings, task)
        replaced = install_folder(folder, target)
    return ImportedProblem(
        source=str(path), task_id=task_id, prototype=task.spec.prototype, scale=str(planned["scale"])[:20],
        profile_sizes=task.spec.profile.sizes, cases=len(task.spec.cases), tolerance=float(planned["tolerance"]),
        installed_at=str(target), replaced=replaced,
    )


def _plan_in_sandbox(settings: KopeSettings, path: Path, task_id: str) -> dict[str, Any]:
    """Run kernelbench_plan on the problem in the sandbox (it executes the problem file); its answer, checked."""
    result_fd = memory_file("kernelbench-plan")
    try:
        with Scratch(settings.scratch_dir) as scratch:
            # The file name carries the problem's family words and level; only its characters are made safe.
            problem = scratch.inputs / re.sub(r"[^A-Za-z0-9_.-]", "_", path.name)
            shutil.copyfile(path, problem)
            problem.chmod(0o644)
            try:
                run = run_worker(scratch, "kope_mcp.app.kernelbench_worker",
                                 {"problem": scratch.inside(problem), "task_id": task_id}, result_fd, SandboxLimits(
                                     wall_seconds=PLAN_WALL_S, cpu_seconds=int(PLAN_WALL_S) * (os.cpu_count() or 1),
                                     address_space_bytes=settings.memory_limit_bytes))
            except SandboxUnavailable as exc:
                raise ProblemError(f"a KernelBench problem runs only in the sandbox, which this machine lacks: "
                                   f"{exc}") from None
        raw = read_memory_file(result_fd, 4 * _FILE_CAP)
    finally:
        os.close(result_fd)
    try:
        answer = json.loads(raw) if raw else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        tail = run.stderr_tail.strip()[-400:]
        raise ProblemError(f"planning it in the sandbox {run.describe()} without an answer"
                           + (f": {tail}" if tail else ""))
    if "skip" in answer:
        raise ProblemError(str(answer["skip"])[:800])
    files = answer.get("files")
    if (not isinstance(files, dict) or set(files) != set(_GENERATED)
            or not all(isinstance(v, str) and len(v) <= _FILE_CAP for v in files.values())
            or not isinstance(answer.get("tolerance"), int | float)):
        raise ProblemError("planning it in the sandbox gave a malformed answer")
    return answer
