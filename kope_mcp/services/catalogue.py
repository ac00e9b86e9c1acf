"""The task catalogue as the tools present it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from kope_mcp.errors import DeviceLostError, UnknownBackendError
from kope_mcp.models import ArgumentInfo, CaseInfo, TargetSignature, TaskDetail, TaskList, ToleranceInfo
from kope_mcp.targets.base import Target, TargetStatus
from kope_mcp.tasks.registry import FAMILIES, TaskRegistry
from kope_mcp.tasks.spec import C_TYPES, CaseSpec

if TYPE_CHECKING:
    from kope_mcp.settings import KopeSettings
    from kope_mcp.tasks.loader import Task


class Catalogue(Protocol):
    """What the catalogue reads: the tasks, this machine's backends, the cluster's devices (a Workbench is one)."""

    tasks: TaskRegistry
    targets: dict[str, Target]

    @property
    def cluster(self) -> Any: ...

    def backends_for(self, task: Task) -> list[str]: ...


@dataclass
class LocalCatalogue:
    """This machine's tasks and backends with no workbench around them (no memory, no cluster): what the stdio
    proxy answers the catalogue from while its home's first daemon starts (app/proxy_early.py)."""

    tasks: TaskRegistry
    targets: dict[str, Target]
    cluster: None = None

    @classmethod
    def of(cls, settings: KopeSettings) -> LocalCatalogue:
        from kope_mcp.targets.registry import load_targets

        return cls(TaskRegistry.default(settings.home), load_targets(settings))

    def backends_for(self, task: Task) -> list[str]:
        return [name for name, t in self.targets.items() if t.supports(task)]

    def target_hardware_key(self, name: str) -> str:
        """As the workbench's (workbench_devices.py), for a server without a cluster."""
        if name not in self.targets:
            raise UnknownBackendError(name, self.targets)
        return self.targets[name].hardware().key


def list_tasks(workbench: Catalogue, family: str | None = None, level: int | None = None) -> TaskList:
    found = workbench.tasks.list(family, level)

    def line(task_id: str, family: str, level: int, summary: str, backends: list[str]) -> str:
        # Only the exception is spelled out: most tasks are C only, and one line each keeps the whole catalogue
        # (53 packaged tasks) near 1,500 tokens for the calling model.
        extra = f" [backends: {', '.join(backends)}]" if backends != ["c"] else ""
        return f"{task_id} ({family}, L{level}): {summary}{extra}"

    return TaskList(
        tasks=[line(t.id, t.spec.family, t.spec.level, t.spec.summary, workbench.backends_for(t)) for t in found],
        count=len(found),
        families=list(FAMILIES),
        backends={name: describe_status(t.status()) for name, t in workbench.targets.items()},
        devices=_cluster_devices(workbench),
    )


def _cluster_devices(workbench: Catalogue) -> dict[str, list[str]]:
    devices: dict[str, list[str]] = {}
    if workbench.cluster is None:
        return devices
    try:
        remote = workbench.cluster.devices()
    except DeviceLostError:
        return devices  # the catalogue stays available while the cluster is not (list_devices says why)
    for key, target in sorted(remote.items()):
        if target.status().profile:
            devices.setdefault(target.name, []).append(key)
    return devices


def describe_status(status: TargetStatus) -> str:
    can = [word for word, on in (("compile", status.compile), ("run_tests", status.run),
                                 ("profile", status.profile)) if on]
    text = f"{status.summary}: {', '.join(can) if can else 'unavailable'}"
    return text + (f" ({status.why_not})" if status.why_not and not status.profile else "")


def describe_task(workbench: Catalogue, task_id: str) -> TaskDetail:
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
        gpu_profile_case=(CaseInfo(name=spec.profile_gpu.name, sizes=spec.profile_gpu.sizes) if spec.profile_gpu
                          else None),
        tolerance=[ToleranceInfo(dtype=d, atol=t.atol, rtol=t.rtol) for d, t in spec.tolerance.items()],
        profile_tolerance=[ToleranceInfo(dtype=d, atol=t.atol, rtol=t.rtol)
                           for d, t in spec.tolerance_for(spec.profile).items()],
        profile_inputs=profile_inputs(spec.profile),
        flops=str(spec.flops),
        bytes=str(spec.bytes),
        reference_source=task.reference_source,
        baseline_source=task.baseline_source,
        rules=spec.all_rules(),
        backends=workbench.backends_for(task),
        default_flags=workbench.targets["c"].default_flags() if "c" in workbench.targets else [],
        targets=[
            TargetSignature(backend=name, language=target.language, signature=signature,
                            baseline_source=target.baseline_source(task), rules=target.rules(task),
                            available=describe_status(target.status()))
            for name, target in workbench.targets.items()
            if name != "c" and (signature := target.signature(task)) is not None
        ],
    )


def profile_inputs(case: CaseSpec) -> str:
    """What a kernel should know about the inputs at the profiling size: the structure that makes every element
    count (tasks/structure.py), stated so that an honest kernel is never surprised by it."""
    parts = ["fresh random inputs each profile"]
    if case.sparse:
        parts.append(f"float inputs of 1,024+ elements hold a value in one element of {case.sparse} (the same "
                     "positions in every float input of that shape) and exactly 0.0 elsewhere")
    if case.outliers:
        parts.append(f"the first carries {case.outliers} outlier(s) of large magnitude at random positions")
    if case.sparse or case.outliers:
        parts.append("every element counts: a subsample misses them; every element still has to be read")
        return "; ".join(parts)
    return "fresh random inputs each profile, as in the cases"

