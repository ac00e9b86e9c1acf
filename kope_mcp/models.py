"""Pydantic models for every tool's input and output: they are the JSON schemas MCP clients see."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

from kope_mcp.hardware import HardwareProfile

FailureKind = Literal["not_compiled", "crash", "timeout", "mismatch", "nan", "input_modified", "wrong_shape",
                      "load_error", "out_of_bounds_write"]
ProfileFailure = Literal["wrong_at_profile_size", "crash_at_profile_size", "load_error", "timing_unverified",
                         "interfered"]


class TaskList(BaseModel):
    tasks: list[str] = Field(description="One line per task: '<id> (<family>, L<level>): <summary>'; levels go "
                             "from 1 (plain element-wise) to 4 (fused multi-stage).")
    count: int
    backends: dict[str, str] = Field(default_factory=dict, description="Per backend: what this server can do with "
                                     "it (compile, run_tests, profile) and what is missing. A task line lists its "
                                     "backends when it has more than 'c'.")
    families: list[str] = Field(description="Every family name, for filtering.")
    devices: dict[str, list[str]] = Field(default_factory=dict, description="With a cluster: per backend, the "
                                          "worker devices that can profile it (a task runs on the devices of its "
                                          "backends; pass one as compile_kernel's `device`).")


class ArgumentInfo(BaseModel):
    name: str
    kind: Literal["in", "out", "size", "scalar"]
    c_type: str
    shape: list[str] = Field(default_factory=list, description="Extents, as expressions over the sizes.")
    value: float | None = Field(None, description="The fixed value of a scalar argument.")


class CaseInfo(BaseModel):
    name: str
    sizes: dict[str, int]


class ToleranceInfo(BaseModel):
    dtype: str
    atol: float
    rtol: float
    rule: str = "passes when |got - expected| <= atol + rtol * |expected| for every element"


class TaskDetail(BaseModel):
    id: str
    family: str
    level: int
    summary: str
    description: str
    prototype: str = Field(description="The exact C prototype your source must define (backend 'c').")
    arguments: list[ArgumentInfo]
    cases: list[CaseInfo] = Field(description="Correctness cases run by run_tests (each with 2 input seeds).")
    profile_case: CaseInfo = Field(description="The size profile_kernel measures on a CPU (the c backend, and the "
                                   "GPU backends where the server has no GPU).")
    gpu_profile_case: CaseInfo | None = Field(None, description="The size profile_kernel measures on a GPU (the "
                                              "triton and cuda backends on a server with one): a size that fills "
                                              "the device. None: the CPU size applies there too.")
    tolerance: list[ToleranceInfo]
    profile_tolerance: list[ToleranceInfo] = Field(default_factory=list, description="The tolerance outputs are "
                                                   "checked at, at the profiling size and in the case run_tests "
                                                   "draws near it (wider than `tolerance` only where float32 "
                                                   "rounding over millions of elements needs it).")
    profile_inputs: str = Field("", description="How the inputs at the profiling size are drawn, where it matters "
                                "to a kernel (outliers at random positions).")
    flops: str = Field(description="FLOP count per call as an expression over the sizes.")
    bytes: str = Field(description="Minimum bytes moved per call, as an expression over the sizes.")
    reference_source: str = Field(description="The reference (ground truth) in Python.")
    baseline_source: str | None = Field(description="The naive C baseline that speedups are measured against; null "
                                        "when the task has none and speedups are measured against the reference.")
    rules: list[str]
    backends: list[str] = Field(description="The backends this task can be written for (pass one to compile_kernel).")
    default_flags: list[str] = Field(description="C flags always passed; yours are appended (a later -O wins).")
    targets: list[TargetSignature] = Field(default_factory=list, description="Per backend other than 'c': the "
                                           "entry point to define, its naive baseline and rules.")


class TargetSignature(BaseModel):
    backend: str
    language: str
    signature: str = Field(description="What your source must define, in that language.")
    baseline_source: str | None = Field(description="The naive kernel in that language speedups are measured "
                                        "against.")
    rules: list[str]
    available: str = Field(description="What this server can do with it: compile, run, profile, and why not.")


class KernelResources(BaseModel):
    """Static resource use of one compiled GPU kernel (from ptxas / cuobjdump), known without running it."""

    name: str
    registers: int | None = Field(None, description="Registers per thread.")
    shared_bytes: int | None = Field(None, description="Static shared memory per block.")
    local_bytes: int | None = Field(None, description="Local memory (stack/spills) per thread.")
    spill_stores: int | None = None
    spill_loads: int | None = None
    num_warps: int | None = None


class DiagnosticInfo(BaseModel):
    line: int = Field(description="Line in your submitted source (0 when the message is not about a line of it).")
    column: int
    severity: Literal["error", "warning", "note"]
    message: str


class CompileResult(BaseModel):
    kernel_id: str = Field(description="Pass this to run_tests, then profile_kernel.")
    session_id: str = Field(description="Pass this back to compile_kernel to continue the same trajectory.")
    task_id: str
    ok: bool
    diagnostics: list[DiagnosticInfo]
    log: str = Field(description="Trimmed compiler output.")
    seconds: float
    cached: bool = Field(description="True when an identical build (same source, flags, task) was reused.")
    flags: list[str]
    parent_id: str | None = None
    backend: str = "c"
    device: str = Field("c", description="Where it was built and where run_tests and profile_kernel will run it: a "
                        "backend of this server ('c') or a cluster device ('c@gpu-box').")
    target_arch: str | None = Field(None, description="The GPU architecture it was compiled for (GPU backends).")
    resources: list[KernelResources] = Field(default_factory=list, description="Per GPU kernel: registers, shared "
                                             "memory, spills (GPU backends).")
    warnings: list[str] = Field(default_factory=list)
    next_step: str


class CaseResult(BaseModel):
    name: str
    sizes: dict[str, int]
    passed: bool
    max_abs_error: float | None = Field(None, description="Over finite elements; null when none was finite.")
    max_rel_error: float | None = None
    mismatches: int = Field(0, description="Elements outside the tolerance (unwritten and NaN ones included).")
    unwritten: int = Field(0, description="Output elements the kernel never wrote (still hold the NaN poison).")
    first_bad_index: int | None = Field(None, description="Flat (row-major) index of the first bad element.")
    first_bad_output: str | None = None
    expected: float | None = Field(None, description="Expected value at first_bad_index.")
    got: float | None = Field(None, description="Value found at first_bad_index (NaN is shown as null).")
    inputs_modified: list[str] = Field(default_factory=list)
    out_of_bounds: list[str] = Field(default_factory=list, description="Buffers the kernel wrote outside of "
                                     "(guard zones before and after every buffer): 'C after its end (+3 elements)'.")


class TestReport(BaseModel):
    kernel_id: str
    task_id: str
    passed: bool
    failure: FailureKind | None = None
    message: str = Field(description="One paragraph: what failed, where, and a likely cause.")
    cases: list[CaseResult]
    seeds_per_case: int
    drawn_case_seed: int | None = Field(None, description="Seed of the case drawn for this run near the profiling "
                                        "size (its name starts with 'drawn_'; get_task does not list it).")
    warnings: list[str] = Field(default_factory=list)
    next_step: str


class TimingStats(BaseModel):
    median_s: float
    iqr_s: float = Field(description="Interquartile range of the samples.")
    ci95_low_s: float = Field(description="95% confidence interval of the median (order statistics).")
    ci95_high_s: float
    n: int = Field(description="Number of samples (each the mean of `calls_per_sample` back-to-back calls).")
    calls_per_sample: int
    relative_iqr: float


class CostCounts(BaseModel):
    """Deterministic counts from valgrind (the same on every run of the same binary and inputs)."""

    tool: str
    instructions: int
    data_reads: int | None = None
    data_writes: int | None = None
    l1_data_misses: int | None = None
    last_level_misses: int | None = None
    baseline_instructions: int | None = None


class ProfileReport(BaseModel):
    kernel_id: str
    task_id: str
    case: CaseInfo
    failure: ProfileFailure | None = Field(None, description="Null for a measurement. wrong_at_profile_size: outputs "
                                           "of timed calls did not match the reference (or one call did not "
                                           "reproduce another on the same inputs); crash_at_profile_size; "
                                           "interfered: the kernel changed the scheduling of a process it is "
                                           "compared with (priority, policy, CPU mask); "
                                           "load_error; timing_unverified: the harness's timings disagreed with "
                                           "the trusted timekeeper. A failure carries no speedup.")
    message: str = Field("", description="What failed, when `failure` is set.")
    kernel: TimingStats | None = None
    baseline: TimingStats | None = None
    baseline_is_reference: bool = Field(False, description="True for tasks without a C baseline (KernelBench "
                                        "imports): the baseline timed is the reference (PyTorch) itself.")
    reference: TimingStats | None = None
    speedup_vs_baseline: float | None = Field(None, description="Median of per-round ratios baseline/kernel "
                                              "(interleaved).")
    speedup_vs_baseline_ci95: tuple[float, float] | None = None
    speedup_vs_reference: float | None = None
    gflops: float | None = None
    gbytes_per_s: float | None = None
    threads: int = Field(description="The CPUs the kernel's timed calls kept busy, measured from its process's CPU "
                         "time over their wall time (not what its flags or OpenMP declare).")
    pinned_cpu: int | None
    rounds: int
    measure_seconds: float
    checked_input_sets: int = Field(0, description="Fresh input sets drawn for this profile that the kernel's timed "
                                    "calls ran on; the first output on each was compared with the reference and "
                                    "every later one on the same set with that first one.")
    repeated_calls: int = Field(0, description="Timed calls on a set the kernel had already run on (0 when the "
                                "sets outnumber the calls, as for all but the largest tasks).")
    noisy: bool = Field(False, description="The measurement is imprecise (its CI is wide, or the machine was too busy "
                        "to corroborate the kernel's own clock, so it was charged the trusted one): the numbers stand, "
                        "but it is never taught to others as a win or a pitfall, unless its whole CI clears the "
                        "gain threshold (an `effective` step, taught with its CI as measured under load). Profile "
                        "again when it is quieter to get a clean verdict.")
    noise_reasons: list[str] = Field(default_factory=list)
    same_code_as_baseline: bool = Field(False, description="The kernel is the baseline's own code (its machine "
                                        "code byte for byte where the backend can compare it, else its source with "
                                        "only the default flags): whatever was measured is code placement or noise, "
                                        "so it is never labelled effective, and it is suspect.")
    hardware: HardwareProfile
    device: str = Field("c", description="Where it was measured: a backend of this server, or a cluster device.")
    waited_s: float = Field(0.0, description="Seconds this profile queued for the device (profiles never overlap "
                            "on a device; the slot goes to the client that used it least lately).")
    device_share: float = Field(0.0, description="This client's share of the device's recent profiling time (0-1, "
                                "use decaying with a 60 s half-life), this profile included.")
    warnings: list[str]
    suspect: bool = Field(False, description="The result tripped an integrity check (a CI that contains 1, a rate "
                          "above the machine's roofline): recorded, but never offered to anyone as a win.")
    suspect_reasons: list[str] = Field(default_factory=list)
    deterministic: CostCounts | None = None
    next_step: str


Phase = Literal["start", "compile_error", "incorrect", "optimize"]


class RecordResult(BaseModel):
    experience_id: str = Field(description="The lesson's id ('x-...').")
    attempt_id: str | None = Field(None, description="The kernel (attempt) it was linked to, when one was given.")
    label: str = Field(description="The attempt's measured label, or 'lesson' for an unmeasured one.")
    verified: bool = Field(description="True when this lesson carries a measured outcome: the attempt was measured "
                           "by this server and the lesson is the measuring session's own. False for a lesson "
                           "without a kernel, about a suspect or noisy measurement, or about another agent's "
                           "attempt (then it is your claim about their result).")
    measured: bool = Field(False, description="The attempt's outcome is a clean measurement made by this server "
                           "(whoever wrote the words).")
    about_agent: str | None = Field(None, description="Set when the attempt was measured in another agent's "
                                    "session: that agent. Your words are stored as your claim about it.")
    confidence: float
    strategy: str = Field(description="The canonical strategy it was filed under (near-identical names merge).")
    strategy_id: str
    step_ratio: float | None = None
    speedup: float | None = None
    next_step: str


class ContextItem(BaseModel):
    """One piece of `context`, with the data behind its text, so a program can read fields instead of markdown."""

    id: str
    tier: Literal["hot", "warm", "cold", "history"] = Field(description="hot: your state; warm: this task, family "
                                                            "or error here; cold: elsewhere; history: unselected.")
    kind: Literal["target", "incumbent", "feedback", "case", "fix", "pitfall", "lesson"]
    score: float
    tokens: int = Field(description="Tokens of its text (the encoding is the result's `token_encoding`).")
    span: tuple[int, int] = Field((0, 0), description="Where its text lies in `context`: [start, end) characters.")
    target: str | None = Field(None, description="The backend the experience was gained with (c, triton, cuda).")
    why: str = Field(description="Why it was chosen: the filters, matches and measurements behind its score.")
    strategy: str | None = Field(None, description="The change tried (for a fix, the change that failed).")
    label: str | None = Field(None, description="The measured label: effective, partial, ineffective, negative, "
                              "incorrect, compile_error, unmeasured; 'lesson' for an unmeasured lesson.")
    speedup: float | None = Field(None, description="Versus the naive baseline.")
    step_ratio: float | None = Field(None, description="Versus the kernel it changed (>1: faster).")
    confidence: float | None = None
    verified: bool | None = Field(None, description="Lessons: whether the outcome comes from a measurement.")
    task_id: str | None = None
    family: str | None = None
    hardware: str | None = Field(None, description="The hardware key it was measured on.")
    flags: list[str] = Field(default_factory=list)
    error_signature: str | None = Field(None, description="Failures: the normalised compiler or test error.")
    fix_strategy: str | None = Field(None, description="Fixes: the change that resolved the failure.")
    fix_id: str | None = Field(None, description="Fixes: the kernel that resolved it.")
    origin: str | None = Field(None, description="Imported from another home (its id and export time): measured "
                               "there, untested here. Absent for this home's own.")
    about_agent: str | None = Field(None, description="Lessons written about another agent's attempt: that agent "
                                    "(the words are the writer's claim, the measurement that agent's session's).")
    agent: str | None = Field(None, description="Who produced it: the client (and label) of the session that "
                              "measured the attempt, or that wrote the lesson.")

    @model_serializer(mode="wrap")
    def _without_nulls(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        # Fields an item does not have are left out rather than sent as null: an answer's ~20 items carry ~12
        # nulls each, which every client parses (and an SDK client validates: ~35% of that time) and a model may
        # read. No return annotation: one would replace this model's JSON schema with the annotation's.
        return {key: value for key, value in handler(self).items() if value is not None}


class QueryResult(BaseModel):
    context: str = Field(description="Markdown ready to paste into the next prompt.")
    items: list[ContextItem]
    tokens_used: int = Field(description="Tokens of `context` in `token_encoding`; <= the budget.")
    token_budget: int
    token_encoding: str = Field(description="How tokens are counted: 'cl100k_base' (a real BPE encoding), or the "
                                "calibrated character estimate when its file is unavailable.")
    phase: Phase = Field(description="The phase the selection was made for (given, or inferred from the session).")
    candidates: int = Field(description="Distinct experiences considered.")
    dropped: int = Field(description="Candidates left out (budget, caps, near-duplicates).")
    dropped_reasons: dict[str, int]
    semantic_search: bool = Field(description="Whether embeddings were used (False while the model loads).")
    semantic_status: str = Field(description="The embedding model's state and, while a backlog is being embedded, how "
                                 "many items semantic search covers and how many texts wait.")
    warnings: list[str]


class MemoryHistory(BaseModel):
    """The whole memory, oldest first (resource kope://memory/history.json): what an agent that pastes its entire
    history would read, with the data behind each line."""

    context: str
    items: list[ContextItem]
    tokens: int
    token_encoding: str


class DeviceInfo(BaseModel):
    id: str = Field(description="Pass as `device` to compile_kernel; run_tests and profile_kernel follow the build.")
    backend: str
    where: str = Field(description="'this server', or the cluster worker and its host.")
    hardware_key: str = Field(description="What results measured here are recorded under in the memory.")
    status: str = Field(description="'ready' (compile, test, profile), or what it cannot do and why.")
    queue: int = Field(description="Profiles running or waiting for this device now (they never overlap).")


class DeviceList(BaseModel):
    devices: list[DeviceInfo]
    cluster: str | None = Field(None, description="The Ray cluster this server dispatches to; null: this machine.")
    warnings: list[str] = Field(default_factory=list)


class SessionStep(BaseModel):
    """One attempt of a session, as the session view draws it."""

    kernel_id: str
    parent_id: str | None = Field(None, description="The attempt it changed (the tree's edge).")
    strategy: str | None = Field(None, description="The change tried (the edge's words).")
    target: str
    created_at: str
    verdict: str = Field(description="compile_error, incorrect, crash..., unmeasured (correct, not profiled), or "
                         "the measured label: effective, partial, ineffective, negative.")
    speedup: float | None = Field(None, description="Versus the naive baseline (1.0).")
    speedup_ci95: tuple[float, float] | None = None
    noisy: bool = False
    suspect: bool = False
    best_so_far: float | None = Field(None, description="The best clean speedup of the session up to and with "
                                      "this attempt (noisy and suspect ones never count).")


class Roof(BaseModel):
    """What this machine can do at most, per thread (a kernel's point above it did not do the work it claims)."""

    peak_gflops_per_thread: float = Field(description="float32: a generous 5 GHz x FMA lanes x 2 units x 2 flops.")
    bandwidth_gbps: float | None = Field(None, description="The best single-thread memory stream measured here; "
                                         "None until a profile has measured it.")


class SessionView(BaseModel):
    """A session's attempts in order, for the session view (resource kope://attempts/{kernel_id}/session)."""

    task_id: str
    family: str
    hardware_key: str
    agent: str = Field(description="The client (and label) the session belongs to.")
    started_at: str
    steps: list[SessionStep]
    incumbent_id: str | None = None
    best_speedup: float | None = None
    roof: Roof | None = Field(None, description="This machine's, when the session ran on it (CPU).")
