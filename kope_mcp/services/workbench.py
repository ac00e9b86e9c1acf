"""The workbench: compile a candidate, test it against the reference, profile it against the baseline."""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Callable

from kope_mcp.cluster.dispatch import cluster_roster
from kope_mcp.diagnostics import Diagnostic
from kope_mcp.errors import (
    MAX_STRATEGY_CHARS,
    BaselineFailedError,
    BuildTamperedError,
    CancelledCallError,
    DeviceUnavailableError,
    EmptySourceError,
    FailedTestsError,
    NoDeviceError,
    NotCompiledError,
    NotTestedError,
    SandboxUnavailableError,
    ServerStoppingError,
    SourceTooLargeError,
    TargetMismatchError,
    TaskMismatchError,
    check_length,
)
from kope_mcp.hardware import keep_bounds_in
from kope_mcp.memory.experience_memory import ExperienceMemory, new_id, now, source_hash
from kope_mcp.memory.records import AgentInfo, AttemptRecord
from kope_mcp.models import (
    CaseInfo,
    CaseResult,
    CompileResult,
    CostCounts,
    DiagnosticInfo,
    FailureKind,
    KernelResources,
    ProfileReport,
    TestReport,
)
from kope_mcp.runtime import cancel
from kope_mcp.runtime.sandbox import UNSAFE_WARNING, capabilities, remove_stale_scratch, stopping, unsafe_opt_out
from kope_mcp.services.correctness import judge_case, merge_seeds
from kope_mcp.services.fair_slot import FairSlot
from kope_mcp.services.gpu_verdicts import gpu_clock_warnings, gpu_suspect_reasons
from kope_mcp.services.profile_inputs import draw_profile_inputs, variant_references
from kope_mcp.services.references import ReferenceRunner
from kope_mcp.services.stats import paired_speedup, ratio_spread, summarize
from kope_mcp.services.test_inputs import CasePreparer
from kope_mcp.services.turns import Turns
from kope_mcp.services.verdicts import (
    FAILURE_NEXT_STEPS,
    SEEDS_PER_CASE,
    measured_threads,
    noise_reasons,
    profile_failure,
    profile_warnings,
    same_source_as_baseline,
    suspect_reasons,
    test_message,
    untimed_work_reasons,
    worst_failure,
)
from kope_mcp.services.workbench_devices import WorkbenchDevices
from kope_mcp.settings import KopeSettings
from kope_mcp.targets.base import CompileOptions, Target
from kope_mcp.targets.builds import TamperedBuildError
from kope_mcp.targets.native_runner import HarnessOutcome
from kope_mcp.targets.registry import load_targets
from kope_mcp.tasks.drawn import draw_case
from kope_mcp.tasks.registry import TaskRegistry

ProgressFn = Callable[[float, float, str], None]
log = logging.getLogger(__name__)


def _noop(done: float, total: float, message: str) -> None:
    return None


# How stale a running server's task catalogue may be: added, edited or removed task folders are seen within this.
TASKS_WATCH_S = 1.0
# Profile input pools held at once across all devices (a cluster server has a slot per device; each profile
# holds its pool from drawing it to judging the outputs).
PROFILE_POOLS_AT_ONCE = 2


class Workbench(WorkbenchDevices):
    """A device-agnostic compile -> test -> profile orchestrator: the target (backend + device) builds, runs and
    times; the workbench records, judges against the reference and computes the statistics, the same for all."""

    def __init__(self, settings: KopeSettings, tasks: TaskRegistry | None = None,
                 memory: ExperienceMemory | None = None, targets: dict[str, Target] | None = None) -> None:
        self.settings = settings
        self.home_warnings = settings.ensure_home()
        for warning in self.home_warnings:
            log.warning("%s", warning)
        if removed := remove_stale_scratch(settings.scratch_dir):
            log.info("removed %d scratch folder(s) left by servers that are gone", removed)
        self.tasks = tasks or TaskRegistry.default(settings.home, watch=TASKS_WATCH_S)
        self.memory = memory or ExperienceMemory.open(settings.memory_path, settings.embeddings)
        # For tests and tools that inspect the graph; the workbench itself goes through self.memory.
        self.store = self.memory.store
        self.targets = targets if targets is not None else load_targets(settings)
        # A cluster's devices join the local targets under their device ids (``c@gpu-box``); without a cluster
        # nothing of Ray is imported.
        self.cluster = cluster_roster(settings, self.targets) if settings.cluster else None
        keep_bounds_in(settings.home / "bounds.json")
        # Profiles never overlap (a second measurement on a 2-core machine would be the noisy neighbour); the
        # slot goes to the client that used it least lately.
        self._measure_slot = FairSlot()
        self._device_slots: dict[str, FairSlot] = {}  # a cluster device's own slot: its profiles never overlap
        self._slots_lock = threading.Lock()
        # When an agent last asked for a profile: the background re-measure (services/remeasure.py) waits until
        # nobody has for a while, so it is never the neighbour of a session at work.
        self.last_profile_request = time.monotonic()
        self.references = ReferenceRunner(settings)
        self.test_inputs = CasePreparer(self.references)
        self.profile_pools = Turns(PROFILE_POOLS_AT_ONCE, "the wait to draw a profile's inputs")

    # --- compile -------------------------------------------------------------------------------------------
    def compile_kernel(
        self,
        task_id: str,
        source: str,
        backend: str = "c",
        session_id: str | None = None,
        parent_id: str | None = None,
        strategy: str | None = None,
        flags: list[str] | None = None,
        progress: ProgressFn = _noop,
        agent: AgentInfo | None = None,
        target_arch: str | None = None,
        device: str | None = None,
    ) -> CompileResult:
        task = self.tasks.get(task_id)
        if device is None:
            backend = self._device_for(backend)
        else:
            # A device id names its backend; a backend that disagrees with it is a mistake worth saying.
            chosen = self.target(device, task)
            if backend not in ("c", chosen.name):
                raise TargetMismatchError(f"device {device!r} runs the {chosen.name!r} backend, not {backend!r}: "
                                          "omit backend, or pick a device of that backend (list_devices)")
            backend = device
        target = self.target(backend, task)
        size = len(source.encode("utf-8"))
        if size > self.settings.max_source_bytes:
            raise SourceTooLargeError(size, self.settings.max_source_bytes)
        if not source.strip():
            raise EmptySourceError(f"the source is empty; send the complete {target.source_kind}")
        check_length("strategy", strategy, MAX_STRATEGY_CHARS)
        options = CompileOptions(target_arch=target_arch)
        # Everything refusable is refused before a session or an attempt is recorded.
        target.check_flags(list(flags or []), options)
        sandbox_warnings = self._require_sandbox()
        hardware = target.hardware()
        parent = self.memory.attempt(parent_id) if parent_id else None
        if parent is not None and parent.task_id != task_id:
            raise TaskMismatchError(f"parent {parent_id} is a kernel for task {parent.task_id!r}, not {task_id!r}")
        if session_id is not None and self._imported_session(session_id):
            # An imported session's measurements were made in another home: building on it starts the caller's
            # own session here, measured against this machine's baseline, the lineage kept in parent_id.
            session_id = None
        if session_id is not None:
            session = self.memory.session(session_id)
            if session.task_id != task_id:
                raise TaskMismatchError(
                    f"session {session_id} works on task {session.task_id!r}; omit session_id to start a "
                    f"session for {task_id!r}"
                )
        else:
            # Without its session's id a parent is anyone's attempt (a client's self-description proves nothing:
            # two clients of the same software look alike): building on it starts the caller's own session, the
            # lineage stays in parent_id, and nothing lands in, or speaks for, the other session.
            session = self.memory.create_session(task, agent, hardware)
        if session.hardware_key != hardware.key:
            raise TargetMismatchError(
                f"session {session.session_id} runs on {session.hardware_key!r}; backend {backend!r} runs on "
                f"{hardware.key!r}. Omit session_id and parent_id to start a session for backend {backend!r}")
        if parent is None:
            parent = self.memory.latest_in_session(session.session_id)
        progress(0, 1, f"compiling for {task_id} ({backend})")
        build = target.compile(task, source, list(flags or []), options)
        _unless_stopping("compile_kernel")
        first_error = next((d.message for d in build.diagnostics if d.severity == "error"), None)
        record = self.memory.record_compile(AttemptRecord(
            kernel_id=new_id("k"), session_id=session.session_id, task_id=task_id, family=task.spec.family,
            hardware_key=session.hardware_key, target=backend, build_hash=build.build_hash, source=source,
            source_hash=source_hash(source), flags=build.flags, ok=build.ok,
            parent_id=parent.kernel_id if parent else None, strategy=strategy, created_at=now(),
            agent=(agent or session.agent).display, diagnostics_digest=_digest(build.diagnostics),
        ), first_error, parent_source=parent.source if parent is not None and parent.source else None)
        progress(1, 1, "compiled" if build.ok else "compile failed")
        errors = sum(1 for d in build.diagnostics if d.severity == "error")
        status = target.status()
        warnings = list(sandbox_warnings)
        if build.ok and not status.run:
            warnings.append(f"compiled only: this server cannot run {backend!r} kernels ({status.why_not})")
        return CompileResult(
            kernel_id=record.kernel_id,
            session_id=session.session_id,
            task_id=task_id,
            ok=build.ok,
            diagnostics=[DiagnosticInfo(line=d.line, column=d.column, severity=d.severity, message=d.message)  # type: ignore[arg-type]
                         for d in build.diagnostics],
            log=build.log,
            seconds=build.seconds,
            cached=build.cached,
            flags=build.flags,
            parent_id=record.parent_id,
            backend=target.name,
            device=backend,
            target_arch=build.traits.get("target_arch"),
            resources=[KernelResources.model_validate(r) for r in build.traits.get("resources", [])],
            warnings=warnings,
            next_step=(
                f"call run_tests(kernel_id='{record.kernel_id}')" if build.ok and status.run else
                f"the build is good; run_tests is not available here: {status.why_not}" if build.ok else
                f"fix the {errors or 'reported'} error(s) at the listed lines and call compile_kernel again with "
                f"session_id='{session.session_id}'"
            ),
        )

    # --- test ----------------------------------------------------------------------------------------------
    def run_tests(self, kernel_id: str, progress: ProgressFn = _noop) -> TestReport:
        with contextlib.ExitStack() as held:  # a drawn case's turn, when it takes one, ends with the call
            return self._run_tests(kernel_id, progress, held)

    def _run_tests(self, kernel_id: str, progress: ProgressFn, held: contextlib.ExitStack) -> TestReport:
        record = self.memory.attempt(kernel_id)
        task = self.tasks.get(record.task_id)
        if not record.ok:
            report = TestReport(
                kernel_id=kernel_id, task_id=task.id, passed=False, failure="not_compiled",
                message="this kernel did not compile, so nothing was run", cases=[], seeds_per_case=SEEDS_PER_CASE,
                next_step="fix the compile errors and call compile_kernel again",
            )
            self._save_test(record, report)
            return report
        target = self.target(record.target)
        status = target.status()
        if not status.run:
            raise NoDeviceError(f"kernel {kernel_id} ({record.target}) compiled, but this server cannot run it: "
                                f"{status.why_not}")
        sandbox_warnings = self._require_sandbox()
        progress(0, 3, "preparing inputs and reference outputs")
        wanted = [(c, s, True) for c in task.spec.cases for s in range(SEEDS_PER_CASE)]
        drawn_seed = secrets.randbelow(2**31) if task.spec.drawn_cases and target.draws_cases else None
        if drawn_seed is not None:
            if self.test_inputs.drawing >= self.test_inputs.drawn_at_once:
                progress(0, 3, "waiting for a turn to draw a case near the profiling size (memory bound)")
            held.enter_context(self.test_inputs.drawn_turn())
            wanted.append((draw_case(task.spec, drawn_seed), 0, False))
        prepared = self.test_inputs.prepared(task, wanted)
        self._check_build(target, record.build_hash)
        progress(1, 3, f"running {len(prepared)} case runs in the sandbox ({status.summary})")
        outcome = target.run_cases(task, record.build_hash, [p.case for p in prepared],
                                   wall_s=self.settings.test_timeout_s)
        _unless_device_unavailable(outcome, "run_tests")
        progress(2, 3, "comparing with the reference")
        if outcome.status != "ok":
            failed = outcome.failed_case
            sizes = next((p.case.sizes for p in prepared if p.case.name == failed), {})
            failure_kind: FailureKind = ("timeout" if outcome.status == "timeout" else
                                         "load_error" if outcome.status == "load_error" else "crash")
            report = TestReport(
                kernel_id=kernel_id, task_id=task.id, passed=False,
                failure=failure_kind,
                message=outcome.message,
                cases=[CaseResult(name=failed, sizes=sizes, passed=False)] if failed else [],
                seeds_per_case=SEEDS_PER_CASE, warnings=sandbox_warnings, drawn_case_seed=drawn_seed,
                next_step=("the kernel does not load: define every function you call (or include/import what "
                           "declares it) and recompile" if failure_kind == "load_error" else
                           "fix the crash (check indices against the sizes in the failing case) and recompile"),
            )
            self._save_test(record, report)
            return report
        per_case: dict[str, list[CaseResult]] = {}
        failures: list[tuple[FailureKind, CaseResult]] = []
        names = [a.name for a in task.outputs()]
        for item, got, meta in zip(prepared, outcome.outputs, outcome.result["cases"], strict=True):
            case = item.case
            result, failure = judge_case(case.name, case.sizes, got, item.expected, names,
                                         task.spec.tolerance_for(item.spec), meta["inputs_modified"],
                                         meta.get("out_of_bounds", []))
            per_case.setdefault(case.name, []).append(result)
            if failure:
                failures.append((failure, result))
        cases = [merge_seeds(runs) for runs in per_case.values()]
        passed = not failures
        failure = worst_failure(failures)
        warnings = sandbox_warnings + ([f"run {status.summary}: correctness only, no case drawn near the "
                                        "profiling size"] if not target.draws_cases else [])
        report = TestReport(
            kernel_id=kernel_id, task_id=task.id, passed=passed, failure=failure,
            message=test_message(passed, failure, cases, task, drawn=drawn_seed is not None),
            cases=cases, seeds_per_case=SEEDS_PER_CASE, warnings=warnings, drawn_case_seed=drawn_seed,
            next_step=(f"call profile_kernel(kernel_id='{kernel_id}')" if passed and status.profile else
                       f"passed; profile_kernel is not available here: {status.why_not}" if passed else
                       "fix the kernel (see the first bad index of the failing case) and compile it again"),
        )
        self._save_test(record, report)
        progress(3, 3, "passed" if passed else f"failed: {failure}")
        return report

    def _imported_session(self, session_id: str) -> bool:
        latest = self.memory.latest_in_session(session_id)
        return latest is not None and bool(latest.origin)

    def _require_sandbox(self) -> list[str]:
        """Warnings every result carries; refuses when kernels cannot be isolated and the user did not opt out."""
        caps = capabilities()
        if caps.isolated:
            return []
        if unsafe_opt_out():
            return [UNSAFE_WARNING]
        raise SandboxUnavailableError(
            f"this server cannot isolate untrusted kernels: missing {caps.missing}. `kope doctor` lists each "
            "isolation layer. Fix that, or set KOPE_UNSAFE_NO_SANDBOX=1 for the server to run kernels with "
            "this user's rights (every result then says so)")

    @staticmethod
    def _check_build(target: Target, build_hash: str) -> None:
        try:
            target.check_build(build_hash)
        except TamperedBuildError as exc:
            raise BuildTamperedError(f"{exc}; it will not be loaded. Call compile_kernel again with the same "
                                     "source to rebuild it") from exc

    def _save_test(self, record: AttemptRecord, report: TestReport) -> None:
        _unless_stopping("run_tests")
        self.memory.record_test(record.kernel_id, report)

    # --- profile -------------------------------------------------------------------------------------------
    def profile_kernel(self, kernel_id: str, deterministic: bool = False, time_reference: bool = True,
                       progress: ProgressFn = _noop, agent: AgentInfo | None = None,
                       background: bool = False) -> ProfileReport:
        """``background``: the server's own re-measure, which does not count as a request."""
        if not background:
            self.last_profile_request = time.monotonic()
        record = self.memory.attempt(kernel_id)
        if not record.ok:
            raise NotCompiledError(f"kernel {kernel_id} did not compile; fix it and call compile_kernel again")
        target = self.target(record.target)
        status = target.status()
        if not status.profile:
            raise NoDeviceError(f"kernel {kernel_id} ({record.target}) cannot be timed on this server: "
                                f"{status.why_not}")
        if record.test is None:
            raise NotTestedError(f"kernel {kernel_id} has not been tested; call run_tests(kernel_id='{kernel_id}') "
                                 "first: only a correct kernel is profiled")
        if not record.test["passed"]:
            raise FailedTestsError(f"kernel {kernel_id} failed run_tests ({record.test['failure']}); only a correct "
                                   "kernel is profiled: fix it, recompile and test again")
        sandbox_warnings = self._require_sandbox()
        task = self.tasks.get(record.task_id)
        self._check_build(target, record.build_hash)
        device_class = target.device_class()
        profile = task.spec.profile_for(device_class)
        sizes = profile.sizes
        hardware = target.hardware()
        # Calls on the same set must agree within the task's own tolerance, not the profiling case's wider one
        # (that one allows for float32 rounding against the reference over millions of elements; one kernel's
        # calls differ at most by their summation order): a kernel cheap on all but the first call is caught.
        tol = next(iter(task.spec.tolerance.values()))
        progress(0, 3, "waiting for the measurement slot")
        client = (agent or AgentInfo()).display
        slot = self.measure_slot(record.target)
        with slot.hold(client) as wait, contextlib.ExitStack() as pools:
            # Drawn only once the device is this call's: a queued profile holds no input pool (0.6-1.2 GB each
            # for vector_add; eight queued clients took the daemon to 5.8 GB and the OOM killer).
            if self.profile_pools.taken >= self.profile_pools.at_once:
                progress(1, 3, "waiting for a turn to draw the profiling inputs (memory bound: other devices' "
                         "profiles hold theirs)")
            pools.enter_context(self.profile_pools.turn())
            progress(1, 3, "drawing fresh input sets and their reference outputs at the profiling size")
            pool = draw_profile_inputs(task, self.references, device_class)
            sets, expected = pool.sets, pool.expected
            cap = self.settings.profile_time_cap_s
            progress(2, 3, f"measuring kernel, baseline{' and reference' if time_reference else ''} interleaved "
                     f"(~{cap:g} s)")
            measured = target.profile(task, record.build_hash, sets, with_reference=time_reference,
                                      time_cap_s=cap, consistency=(tol.atol, tol.rtol), wall_s=cap * 4 + 60)
            outcome = measured.outcome
            costs = target.deterministic_costs(task, record.build_hash, sets[0]) \
                if deterministic and outcome.status == "ok" else None
            _unless_stopping("profile_kernel")
            _unless_device_unavailable(outcome, "profile_kernel")
            if outcome.status == "baseline_failed":
                raise BaselineFailedError(
                    f"profile_kernel measured nothing: {outcome.message}. The baseline (or reference) is the task's "
                    "code, not your kernel's: nothing was recorded against it; profile again, and if this repeats "
                    "the task's baseline is broken at its profiling size (tell whoever maintains the task)")
            # Judged while the slot is held, so the next profile draws its pool only once this one's arrays are
            # gone: one profile's arrays at a time (judged after the slot, two overlapped: 4.7 GB peak, 8 clients).
            failure, message = profile_failure(task, outcome, sets, expected, profile,
                                               variants=variant_references(task, outcome, sets))
            # What follows (statistics, the record) needs none of the arrays.
            checked_sets = len(outcome.outputs)
            outcome.outputs = []
            del pool, sets, expected
        queueing = {"device": record.target, "waited_s": round(wait, 3), "device_share": round(slot.share(client), 3)}
        base_key, pin = measured.baseline_key, measured.pinned_cpu
        if failure is not None:
            report = ProfileReport(
                kernel_id=kernel_id, task_id=task.id, case=CaseInfo(name=profile.name, sizes=sizes),
                failure=failure, message=message, hardware=hardware, warnings=sandbox_warnings + measured.warnings,
                threads=1, pinned_cpu=pin, rounds=0, measure_seconds=0.0, **queueing,
                next_step=FAILURE_NEXT_STEPS.get(failure, FAILURE_NEXT_STEPS["wrong_at_profile_size"]),
            )
            self.memory.record_profile(kernel_id, report)
            progress(3, 3, f"failed: {failure}")
            return report
        assert outcome.timings is not None
        threads, thread_reasons = measured_threads(outcome.result, measured.cpus_given, measured.threads)
        samples, inner = outcome.timings.samples, outcome.timings.inner
        kernel_stats = summarize(samples["candidate"], inner["candidate"])
        base_stats = summarize(samples[base_key], inner[base_key])
        ref_stats = summarize(samples["reference"], inner["reference"]) if "reference" in samples else None
        speedup, speedup_ci = paired_speedup(samples[base_key], samples["candidate"])
        speedup_ref = paired_speedup(samples["reference"], samples["candidate"])[0] if ref_stats else None
        flops, nbytes = task.spec.flop_count(sizes), task.spec.byte_count(sizes)
        median = kernel_stats.median_s
        roofline = target.roofline()
        warnings = profile_warnings(kernel_stats.relative_iqr, base_stats.relative_iqr, speedup, speedup_ci,
                                     nbytes, median, threads, roofline, naive_baseline=base_key == "baseline")
        reasons = thread_reasons + untimed_work_reasons(outcome.result, median, threads) + \
            suspect_reasons(speedup_ci, flops, nbytes, median, threads, roofline) + \
            gpu_suspect_reasons(outcome.result, flops, nbytes, median)
        warnings += gpu_clock_warnings(outcome.result)
        same_code = measured.same_code_as_baseline or same_source_as_baseline(
            record.source, record.flags, target.baseline_source(task), target.default_flags())
        if same_code:
            # Never a win, a "what worked" item nor a step's base: what is measured is placement or noise.
            reasons.append("the baseline's own code: a difference measured against it is code placement or noise")
        noise = noise_reasons(ratio_spread(samples[base_key], samples["candidate"]), outcome.timings.conservative)
        warnings += sandbox_warnings + measured.warnings
        if isinstance(costs, str):
            warnings.append(f"no deterministic counts: {costs}")
        if wait > 0.05:
            warnings.append(f"waited {wait:.1f} s for other profiles to finish (profiles never overlap; the slot "
                            "goes to the client that used it least lately)")
        report = ProfileReport(
            kernel_id=kernel_id, task_id=task.id, case=CaseInfo(name=profile.name, sizes=sizes),
            kernel=kernel_stats, baseline=base_stats, baseline_is_reference=base_key == "reference",
            reference=ref_stats,
            speedup_vs_baseline=speedup, speedup_vs_baseline_ci95=speedup_ci, speedup_vs_reference=speedup_ref,
            gflops=flops / median / 1e9 if flops else None, gbytes_per_s=nbytes / median / 1e9 if nbytes else None,
            threads=threads, pinned_cpu=pin, rounds=int(outcome.result.get("rounds", 0)),
            measure_seconds=round(float(outcome.result.get("seconds", 0.0)), 3), hardware=hardware,
            warnings=warnings, deterministic=costs if isinstance(costs, CostCounts) else None,
            checked_input_sets=checked_sets, repeated_calls=int(outcome.result.get("repeated_calls") or 0),
            suspect=bool(reasons), suspect_reasons=reasons, noisy=bool(noise), noise_reasons=noise,
            same_code_as_baseline=same_code,
            **queueing,
            next_step=(
                "record what you tried; try the next optimisation and compile it with parent_id="
                f"'{kernel_id}'" if speedup >= 1.0 else
                "this kernel is slower than the naive baseline: revert to a faster parent and try another idea"
            ),
        )
        self.memory.record_profile(kernel_id, report)
        progress(3, 3, f"speedup vs baseline {speedup:.2f}x")
        return report


def _unless_device_unavailable(outcome: HarnessOutcome, tool: str) -> None:
    """A GPU the run could not initialise is the server's fault: an error of its own, nothing recorded."""
    if outcome.status == "device_unavailable":
        raise DeviceUnavailableError(f"{tool} could not use this server's GPU: {outcome.message}. Nothing was "
                                     "recorded against the kernel; `kope doctor` checks the device in the sandbox")


def _unless_stopping(tool: str) -> None:
    """A run the stopping server, or the call's cancel, ended is not the kernel's outcome: nothing of it may be
    recorded."""
    if stopping():
        raise ServerStoppingError(tool)
    if cancel.cancelled():
        raise CancelledCallError(tool)


def _digest(diagnostics: list[Diagnostic]) -> str:
    """The first few errors, one line each: enough to recognise the failure without the whole log."""
    errors = [f"{d.line}:{d.column} {d.message}" for d in diagnostics if d.severity == "error"]
    return "\n".join(errors[:5])[:1000]
