"""`kope tasks add DIR`: check a user task folder end to end, then keep a copy under KOPE_HOME/tasks."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from pydantic import BaseModel, Field

from kope_mcp.errors import InvalidTaskError
from kope_mcp.services.references import ReferenceRunner
from kope_mcp.services.workbench import Workbench
from kope_mcp.settings import KopeSettings
from kope_mcp.tasks.loader import Task, load_task
from kope_mcp.tasks.registry import SUITE_DIR, USER_TASKS_DIR, TaskRegistry


class AddedTask(BaseModel):
    task_id: str
    prototype: str
    installed_at: str
    replaced: bool
    baseline_cases_passed: int = Field(description="0 for a task without a C baseline (its reference was checked).")


def add_task(settings: KopeSettings, folder: Path, replace: bool = False) -> AddedTask:
    """Validate the files, compile the baseline and run it on the task's own cases, then install the folder.

    Raises InvalidTaskError naming the file and field (or the failing case) when anything is wrong.
    """
    task = load_task(folder.resolve(), trusted=False)  # someone else's folder: its code runs in the sandbox only
    target = install_target(settings, task.id, folder / "task.toml", replace)
    passed = check_task(settings, task)
    replaced = install_folder(folder, target)
    return AddedTask(task_id=task.id, prototype=task.spec.prototype, installed_at=str(target), replaced=replaced,
                     baseline_cases_passed=passed)


def install_folder(folder: Path, target: Path) -> bool:
    """Copy a checked task folder to ``target`` so that a running server, which re-reads KOPE_HOME/tasks when it
    changes, sees the old task or the new one, never half a copy: the copy is made under a hidden name beside
    it (the registry skips hidden folders) and renamed into place. True when an installed task was replaced."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staged = target.with_name(f".{target.name}.new-{os.getpid()}")
    retired = target.with_name(f".{target.name}.old-{os.getpid()}")
    shutil.rmtree(staged, ignore_errors=True)
    shutil.copytree(folder, staged, ignore=shutil.ignore_patterns("__pycache__"))
    replaced = target.exists()
    if replaced:
        os.replace(target, retired)
    os.replace(staged, target)
    if replaced:
        shutil.rmtree(retired, ignore_errors=True)
    return replaced


def install_target(settings: KopeSettings, task_id: str, where: Path, replace: bool) -> Path:
    """Where a user task goes; refuses a packaged id, and an installed one unless replacing."""
    if (SUITE_DIR / task_id).is_dir():
        raise InvalidTaskError(f"{where}: field id: {task_id!r} is a packaged task; choose another id")
    target = settings.home / USER_TASKS_DIR / task_id
    if target.exists() and not replace:
        raise InvalidTaskError(f"a task {task_id!r} is already installed at {target}; pass --replace to update it")
    return target


def check_task(settings: KopeSettings, task: Task) -> int:
    """Run the task end to end before anyone relies on it; returns how many cases its baseline passed.

    With a C baseline: compile it and run it on every case through the real workbench. Without one: run the
    reference on every case twice and require identical results (a reference that is not deterministic per
    seed makes every verdict on a kernel meaningless).
    """
    if task.baseline_source is None:
        # Each case twice in one sandboxed run (the folder is not the package's: its code never runs here).
        twice = [(case, task.case_seed(case)) for case in task.spec.cases for _ in range(2)]
        made = ReferenceRunner(settings).cases(task, twice)
        for index, case in enumerate(task.spec.cases):
            first, again = made[2 * index].expected, made[2 * index + 1].expected
            if any(not np.array_equal(a, b, equal_nan=True) for a, b in zip(first, again, strict=True)):
                raise InvalidTaskError(f"{task.folder / 'reference.py'}: case {case.name!r}: two runs on the same "
                                       "inputs differ; the reference must be deterministic")
        return 0
    # Through the real workbench, in a scratch home (the real one's database may be held by a running server,
    # and a check is not experience worth remembering).
    with tempfile.TemporaryDirectory(prefix="kope-task-check-") as scratch:
        probe = Workbench(settings.model_copy(update={"home": Path(scratch), "embeddings": False}),
                          TaskRegistry([task.folder]))
        compiled = probe.compile_kernel(task.id, task.baseline_source, strategy="baseline check")
        report = probe.run_tests(compiled.kernel_id) if compiled.ok else None
        probe.memory.close()
    if report is None:
        raise InvalidTaskError(f"{task.folder / 'baseline.c'}: does not compile: {compiled.log[-800:]}")
    if not report.passed:
        raise InvalidTaskError(f"{task.folder / 'baseline.c'}: fails the task's own cases ({report.failure}): "
                               f"{report.message}")
    return len(report.cases)
