"""`kope tasks add DIR`: check a user task folder end to end, then keep a copy under KOPE_HOME/tasks."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from pydantic import BaseModel

from kope_mcp.errors import InvalidTaskError
from kope_mcp.services.workbench import Workbench
from kope_mcp.settings import KopeSettings
from kope_mcp.tasks.loader import load_task
from kope_mcp.tasks.registry import SUITE_DIR, USER_TASKS_DIR, TaskRegistry


class AddedTask(BaseModel):
    task_id: str
    prototype: str
    installed_at: str
    replaced: bool
    baseline_cases_passed: int


def add_task(settings: KopeSettings, folder: Path, replace: bool = False) -> AddedTask:
    """Validate the files, compile the baseline and run it on the task's own cases, then install the folder.

    Raises InvalidTaskError naming the file and field (or the failing case) when anything is wrong.
    """
    task = load_task(folder.resolve())
    if (SUITE_DIR / task.id).is_dir():
        raise InvalidTaskError(f"{folder / 'task.toml'}: field id: {task.id!r} is a packaged task; choose another id")
    target = settings.home / USER_TASKS_DIR / task.id
    if target.exists() and not replace:
        raise InvalidTaskError(f"a task {task.id!r} is already installed at {target}; pass --replace to update it")
    # Check the baseline against the reference through the real workbench, in a scratch home (the real one's
    # database may be held by a running server, and a check is not experience worth remembering).
    with tempfile.TemporaryDirectory(prefix="kope-task-check-") as scratch:
        probe = Workbench(settings.model_copy(update={"home": Path(scratch), "embeddings": False}),
                          TaskRegistry([folder.resolve()]))
        compiled = probe.compile_kernel(task.id, task.baseline_source, strategy="baseline check")
        report = probe.run_tests(compiled.kernel_id) if compiled.ok else None
        probe.store.close()
    if report is None:
        raise InvalidTaskError(f"{folder / 'baseline.c'}: does not compile: {compiled.log[-800:]}")
    if not report.passed:
        raise InvalidTaskError(f"{folder / 'baseline.c'}: fails the task's own cases ({report.failure}): "
                               f"{report.message}")
    replaced = target.exists()
    if replaced:
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(folder, target, ignore=shutil.ignore_patterns("__pycache__"))
    return AddedTask(task_id=task.id, prototype=task.spec.prototype, installed_at=str(target), replaced=replaced,
                     baseline_cases_passed=len(report.cases))
