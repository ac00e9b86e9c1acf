"""The rows of the experience graph, as typed records (the store maps them to Kùzu nodes)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator


class AgentInfo(BaseModel):
    """Who produced an experience: the MCP client's name and version, and an optional label it set."""

    name: str = "unknown"
    version: str = ""
    label: str | None = None

    @property
    def display(self) -> str:
        base = f"{self.name} {self.version}".strip()
        return f"{base} [{self.label}]" if self.label else base


class SessionRecord(BaseModel):
    session_id: str
    task_id: str
    hardware_key: str
    agent: AgentInfo = Field(default_factory=AgentInfo)
    created_at: str
    incumbent_id: str | None = None
    incumbent_speedup: float | None = None


class AttemptRecord(BaseModel):
    """One compile -> test -> profile step (the paper's Case)."""

    kernel_id: str
    session_id: str
    task_id: str
    family: str
    hardware_key: str
    target: str = Field(description="The execution target that built and ran it: c, triton, cuda, ...")
    build_hash: str
    source: str = Field("", description="The kernel source; empty in retrieval summaries (see store.sources).")
    source_hash: str
    flags: list[str]
    ok: bool = Field(description="Compiled.")
    parent_id: str | None = None
    strategy: str | None = None
    strategy_id: str | None = None
    opt_layer: str | None = None
    created_at: str
    agent: str = ""
    diff_from_parent: str = Field("", description="Changed lines versus the parent's source (at most 10).")
    error_signature: str | None = None
    diagnostics_digest: str = ""
    tested: bool = False
    correct: bool | None = None
    failure: str | None = None
    failure_message: str = ""
    median_s: float | None = None
    speedup: float | None = Field(None, description="Versus the naive baseline, measured interleaved.")
    speedup_ci_low: float | None = None
    speedup_vs_reference: float | None = None
    step_ratio: float | None = None
    label: str = "unmeasured"
    confidence: float = 0.0
    downstream: float = 0.0
    profile_warnings: list[str] = Field(default_factory=list)
    suspect: bool = Field(False, description="The measurement tripped an integrity check: never taught as a win.")
    suspect_reason: str = ""
    speedup_ci_high: float | None = None
    noisy: bool = Field(False, description="Too imprecise to teach (a wide CI, or conservative timings on a busy "
                        "machine): kept, never served as a win or a pitfall.")
    noise_reason: str = ""
    origin: str = Field("", description="Where the measurement was made when not here: the exporting home and "
                        "when it exported ('' for this home's own). Evidence from elsewhere, never a local win.")

    @property
    def teaches(self) -> bool:
        """A clean verdict: only these become what worked, a pitfall, or a verified lesson."""
        return not self.suspect and not self.noisy

    @model_validator(mode="before")
    @classmethod
    def _before_targets(cls, data: Any) -> Any:
        # Exports written before execution targets (schema 2) name the target `backend` and carry uses_openmp.
        if isinstance(data, dict) and "backend" in data:
            data = {k: v for k, v in data.items() if k not in ("backend", "uses_openmp")} | \
                {"target": data.get("target") or data["backend"]}
        return data

    @property
    def test(self) -> dict[str, object] | None:
        """The latest run_tests outcome, as the workbench checks it."""
        if not self.tested:
            return None
        return {"passed": bool(self.correct), "failure": self.failure, "message": self.failure_message}


class LessonRecord(BaseModel):
    """The agent's account of a step (record_experience), or an unmeasured piece of knowledge."""

    lesson_id: str
    text: str
    strategy: str
    strategy_id: str | None = None
    opt_layer: str | None = None
    rationale: str | None = None
    task_id: str | None = None
    family: str | None = None
    hardware_key: str | None = None
    target: str | None = None
    attempt_id: str | None = None
    verified: bool
    label: str
    step_ratio: float | None = None
    speedup: float | None = None
    confidence: float
    agent: str = ""
    created_at: str
    about_agent: str = Field("", description="Set when the writer is not the agent whose session measured the "
                             "attempt: that agent. The measurement is the server's; these words are the writer's "
                             "claim about someone else's result.")
    origin: str = Field("", description="The home it was imported from ('' for this home's own): its `verified` "
                        "described a measurement made there, so it is stored unverified here.")


class StrategyRecord(BaseModel):
    strategy_id: str
    name: str
    key: str
