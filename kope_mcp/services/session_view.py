"""A session as its view draws it: every attempt in order with its parent, strategy and verdict, the best clean
speedup so far, and this machine's roof (resource kope://attempts/{kernel_id}/session, the views in views/)."""

from __future__ import annotations

from kope_mcp.hardware import detect_hardware, known_bandwidth_gbps, peak_gflops
from kope_mcp.memory.experience_memory import ExperienceMemory
from kope_mcp.memory.records import AttemptRecord
from kope_mcp.models import Roof, SessionStep, SessionView


def verdict(rec: AttemptRecord) -> str:
    if not rec.ok:
        return "compile_error"
    if rec.tested and rec.correct is False:
        return rec.failure or "incorrect"
    if rec.speedup is None:
        return "untested" if not rec.tested else "unmeasured"
    return rec.label


def session_view(memory: ExperienceMemory, kernel_id: str) -> SessionView:
    """The session of attempt ``kernel_id`` (raises unknown_kernel). Reached by an attempt's id, never by the
    session's: a session id is its owner's proof (it lets a lesson be verified), and is not shown to others."""
    attempt = memory.attempt(kernel_id)
    session = memory.session(attempt.session_id)
    steps: list[SessionStep] = []
    best: float | None = None
    for rec in memory.attempts_in_session(attempt.session_id):
        clean = rec.speedup is not None and rec.teaches and rec.correct is not False
        if clean and (best is None or rec.speedup > best):  # type: ignore[operator]
            best = rec.speedup
        ci = ((rec.speedup_ci_low, rec.speedup_ci_high)
              if rec.speedup_ci_low is not None and rec.speedup_ci_high is not None else None)
        steps.append(SessionStep(kernel_id=rec.kernel_id, parent_id=rec.parent_id, strategy=rec.strategy,
                                 target=rec.target, created_at=rec.created_at, verdict=verdict(rec),
                                 speedup=rec.speedup, speedup_ci95=ci, noisy=rec.noisy, suspect=rec.suspect,
                                 best_so_far=best))
    here = detect_hardware()
    roof = (Roof(peak_gflops_per_thread=peak_gflops(here, 1), bandwidth_gbps=known_bandwidth_gbps())
            if session.hardware_key == here.key else None)
    return SessionView(task_id=session.task_id, family=attempt.family, hardware_key=session.hardware_key,
                       agent=session.agent.display, started_at=session.created_at, steps=steps,
                       incumbent_id=session.incumbent_id, best_speedup=best, roof=roof)
