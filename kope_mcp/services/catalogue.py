"""The task catalogue as the tools present it."""

from __future__ import annotations

from kope_mcp.backends.c import BASE_FLAGS
from kope_mcp.models import ArgumentInfo, CaseInfo, TaskDetail, TaskList, ToleranceInfo
from kope_mcp.services.workbench import Workbench
from kope_mcp.tasks.registry import FAMILIES, TaskRegistry
from kope_mcp.tasks.spec import C_TYPES


def list_tasks(tasks: TaskRegistry, family: str | None = None, level: int | None = None) -> TaskList:
    found = tasks.list(family, level)
    return TaskList(
        # One line each keeps the whole catalogue (53 packaged tasks) near 1,500 tokens for the calling model.
        tasks=[f"{t.id} ({t.spec.family}, L{t.spec.level}): {t.spec.summary}" for t in found],
        count=len(found),
        families=list(FAMILIES),
    )


def describe_task(workbench: Workbench, task_id: str) -> TaskDetail:
    task = workbench.tasks.get(task_id)
    spec = task.spec
    return TaskDetail(
        id=spec.id,
        family=spec.family,
        level=spec.level,
        summary=spec.summary,
        description=spec.description.strip(),
        prototype=spec.prototype,
        arguments=[
            ArgumentInfo(name=a.name, kind=a.kind, c_type=C_TYPES[a.dtype] + (" *" if a.is_pointer else ""),
                         shape=[str(e) for e in a.shape], value=a.value)
            for a in spec.args
        ],
        cases=[CaseInfo(name=c.name, sizes=c.sizes) for c in spec.cases],
        profile_case=CaseInfo(name=spec.profile.name, sizes=spec.profile.sizes),
        tolerance=[ToleranceInfo(dtype=d, atol=t.atol, rtol=t.rtol) for d, t in spec.tolerance.items()],
        flops=str(spec.flops),
        bytes=str(spec.bytes),
        reference_source=task.reference_source,
        baseline_source=task.baseline_source,
        rules=spec.all_rules(),
        backends=sorted(workbench.backends),
        default_flags=list(BASE_FLAGS),
    )
