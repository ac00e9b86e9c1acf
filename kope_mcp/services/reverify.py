"""Re-measure imported wins here: `kope memory import FILE --reverify`.

An imported attempt is evidence from another home (its `origin`), never a win here. Re-verifying runs its source
through this home's workbench exactly as an agent's kernel (compile in the sandbox, run_tests, profile against the
naive baseline) in a session of its own, so the local verdict is an ordinary attempt of this home: it teaches only
if it measures as a win here. The local attempt carries a lesson that names the imported one and both verdicts,
so the pair is found together (the lesson is verified by the local measurement, not by the imported one).
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel

from kope_mcp.errors import KopeError
from kope_mcp.experience.service import ExperienceService
from kope_mcp.memory.records import AgentInfo, AttemptRecord
from kope_mcp.services.workbench import Workbench

REVERIFY_AGENT = AgentInfo(name="kope memory import --reverify")
WINNING = ("effective", "partial")


class Reverified(BaseModel):
    imported_id: str
    task_id: str
    there: str  # the imported verdict: "effective 2.31x on <hardware> (<origin>)"
    here_id: str | None = None
    here_label: str | None = None
    here_speedup: float | None = None
    note: str = ""  # why there is no local verdict, or what the profile said beside it


def imported_wins(workbench: Workbench, origin: str | None = None) -> list[AttemptRecord]:
    """Imported attempts that were clean wins where they were measured (from ``origin`` when given)."""
    return [a for a in workbench.memory.all_attempts()
            if a.origin and (origin is None or a.origin == origin) and a.ok and a.correct and a.teaches
            and a.label in WINNING and a.source]


def reverify(workbench: Workbench, attempts: list[AttemptRecord],
             progress: Callable[[str], None] = lambda _: None) -> list[Reverified]:
    experience = ExperienceService(workbench.memory, workbench.tasks)
    results = []
    for index, imported in enumerate(attempts, 1):
        there = (f"{imported.label} {imported.speedup or 0:.2f}x on {imported.hardware_key} ({imported.origin})")
        result = Reverified(imported_id=imported.kernel_id, task_id=imported.task_id, there=there)
        progress(f"[{index}/{len(attempts)}] {imported.kernel_id} ({imported.task_id}, {imported.target}): {there}")
        try:
            _measure(workbench, experience, imported, result)
        except KopeError as exc:  # a task or backend this home lacks, a budget refused: said, not fatal
            result.note = str(exc)
        results.append(result)
    return results


def _measure(workbench: Workbench, experience: ExperienceService, imported: AttemptRecord,
             result: Reverified) -> None:
    compiled = workbench.compile_kernel(imported.task_id, imported.source, backend=imported.target,
                                        strategy=imported.strategy, flags=imported.flags, agent=REVERIFY_AGENT)
    result.here_id = compiled.kernel_id
    if not compiled.ok:
        result.note = "did not compile here"
    else:
        tested = workbench.run_tests(compiled.kernel_id)
        if not tested.passed:
            result.note = f"failed run_tests here: {tested.failure}"
        else:
            report = workbench.profile_kernel(compiled.kernel_id, agent=REVERIFY_AGENT)
            if report.failure is not None:
                result.note = f"profile failed here: {report.failure}"
            elif report.noisy or report.suspect:
                result.note = "; ".join(report.noise_reasons + report.suspect_reasons)
    local = workbench.memory.attempt(compiled.kernel_id)
    result.here_label, result.here_speedup = local.label, local.speedup
    here = f"{local.label}" + (f" {local.speedup:.2f}x" if local.speedup is not None else "")
    experience.record_experience(
        imported.strategy or "re-measured import",
        f"re-measured {imported.kernel_id}, imported ({result.there}): here {here}"
        + (f" ({result.note})" if result.note else ""),
        kernel_id=compiled.kernel_id, session_id=compiled.session_id, agent=REVERIFY_AGENT)
