"""The contract every execution target (toolchain + device) fulfils.

The workbench is a device-agnostic compile -> test -> profile orchestrator: it asks a target for a build, for the
outputs of the test cases, and for corroborated timing samples, and judges them the same way for every target.
Everything device-specific lives behind this contract: the toolchain and its flag policy, diagnostics, how a
task's signature reads in the target's language, how a kernel is called and timed, its sandbox profile, and the
hardware probe that yields the memory's ``hardware_key``.

A target is one module and one entry point in the ``kope_mcp.targets`` group::

    [project.entry-points."kope_mcp.targets"]
    mytarget = "my_package.module:MyTarget"
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from kope_mcp.errors import DeterministicUnavailableError, RefusedFlagError
from kope_mcp.hardware import HardwareProfile
from kope_mcp.targets.builds import BuildResult
from kope_mcp.targets.native_runner import HarnessOutcome, PreparedCase

if TYPE_CHECKING:
    from kope_mcp.models import CostCounts
    from kope_mcp.settings import KopeSettings
    from kope_mcp.tasks.loader import Task


@dataclass(frozen=True)
class TargetStatus:
    """What a target can do on this machine, and why not where it cannot."""

    compile: bool
    run: bool
    profile: bool
    summary: str
    why_not: str = ""
    details: tuple[str, ...] = ()


@dataclass
class Measurement:
    """What a target's profile returns: the harness outcome (timings corroborated, outputs to judge) and how it
    ran."""

    outcome: HarnessOutcome
    baseline_key: str  # "baseline" or "reference": what the speedup is measured against
    threads: int = 1  # what the target let it use; what it used is measured (verdicts.measured_threads)
    pinned_cpu: int | None = None
    warnings: list[str] = field(default_factory=list)
    cpus_given: int = 1  # CPUs the candidate was allowed to run on
    # The candidate's entry point is the baseline's machine code byte for byte (its source moved code around, or
    # is the baseline's): a speedup measured then is code placement, never an optimisation to teach.
    same_code_as_baseline: bool = False


@dataclass(frozen=True)
class CompileOptions:
    target_arch: str | None = None


class Target(ABC):
    """One toolchain on one kind of device. Subclasses set the class attributes and implement the methods."""

    name: ClassVar[str]
    language: ClassVar[str]
    #: What ``source`` must be, in one line for the tool's docs and errors.
    source_kind: ClassVar[str]
    #: The drawn case near the profiling size (tasks/drawn.py) is run where running is cheap enough.
    draws_cases: ClassVar[bool] = True

    def __init__(self, settings: KopeSettings) -> None:
        self.settings = settings

    # --- what it is and what it can do here ----------------------------------------------------------------
    @abstractmethod
    def status(self) -> TargetStatus:
        """Probe the toolchain and device (cheap after the first call)."""

    @abstractmethod
    def hardware(self) -> HardwareProfile:
        """The device results are measured on; its ``key`` is the memory's hardware_key."""

    def hardware_key(self, profile: HardwareProfile) -> str:
        """The key that ``profile``'s own facts give on this target: a cluster worker's described device is offered
        only when its key is this (targets that derive their key from the facts say how here)."""
        return profile.key

    # --- tasks in this target's language -------------------------------------------------------------------
    @abstractmethod
    def signature(self, task: Task) -> str | None:
        """The entry point the source must define, in this target's language; None when the task has none here."""

    def supports(self, task: Task) -> bool:
        return self.signature(task) is not None

    @abstractmethod
    def baseline_source(self, task: Task) -> str | None:
        """The naive kernel speedups are measured against (None: the reference is the baseline)."""

    def rules(self, task: Task) -> list[str]:
        return []

    def default_flags(self) -> list[str]:
        return []

    def check_flags(self, flags: list[str], options: CompileOptions) -> None:
        """Refuse what this target does not take, before anything is recorded (RefusedFlagError)."""
        if flags:
            raise RefusedFlagError(" ".join(flags), f"the {self.name} backend takes no compiler flags", "none")
        if options.target_arch is not None:
            raise RefusedFlagError(f"target_arch={options.target_arch}",
                                   f"the {self.name} backend does not compile for a GPU architecture", "omit it")

    # --- the workflow --------------------------------------------------------------------------------------
    @abstractmethod
    def compile(self, task: Task, source: str, flags: list[str], options: CompileOptions) -> BuildResult:
        """Build in the sandbox; a compile error is a normal result (ok=False with diagnostics at user lines)."""

    @abstractmethod
    def check_build(self, build_hash: str) -> None:
        """Raise TamperedBuildError when a build's artifact no longer matches what was built."""

    @abstractmethod
    def run_cases(self, task: Task, build_hash: str, cases: list[PreparedCase], *, wall_s: float) -> HarnessOutcome:
        """Run the kernel once per case in the sandbox; outputs and per-case metadata for the workbench to judge."""

    @abstractmethod
    def profile(self, task: Task, build_hash: str, sets: list[PreparedCase], *, with_reference: bool,
                time_cap_s: float, consistency: tuple[float, float], wall_s: float) -> Measurement:
        """Time the kernel interleaved with the baseline (and the reference) on the input sets; timings must be
        corroborated by something the kernel cannot forge."""

    def deterministic_costs(self, task: Task, build_hash: str, case: PreparedCase) -> CostCounts | str:
        raise DeterministicUnavailableError(
            f"deterministic counts are not available for backend {self.name!r}; call profile_kernel with "
            "deterministic=false")

    def device_class(self) -> str:
        """Which of a task's profiling sizes applies here: "cpu", or "gpu" where kernels run on a GPU."""
        return "cpu"

    def roofline(self) -> HardwareProfile | None:
        """The hardware whose peak a result is checked against (None: no plausibility bound for this target)."""
        return None
