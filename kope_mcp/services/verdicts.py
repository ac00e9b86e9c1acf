"""What a measurement means: the verdict of a test run, failures at the profiling size, the integrity signals
that make a result suspect, and the warnings a report carries. Pure functions over what the harness returned."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import numpy as np

from kope_mcp.hardware import ROOF_MIN_BYTES, HardwareProfile, peak_gflops, streaming_bandwidth_gbps
from kope_mcp.models import CaseResult, FailureKind, ProfileFailure
from kope_mcp.services.correctness import judge_case
from kope_mcp.targets.native_runner import HarnessOutcome, PreparedCase, checked_sets
from kope_mcp.tasks.loader import Task
from kope_mcp.tasks.spec import CaseSpec

SEEDS_PER_CASE = 2
NOISY_RELATIVE_IQR = 0.05
# Per-round speedups (baseline/kernel of one round) whose interquartile range exceeds this fraction of their
# median make a noisy verdict: kept, never taught. Not the CI's width: with the 7 rounds a short profile gets, the
# CI of the median is the whole range of the rounds, and one preempted round would make every such result noisy.
NOISY_RATIO_IQR = 0.25
IMPLAUSIBLE_SPEEDUP = 10.0
# Above the fastest stream measured here, x threads, x this: the kernel skipped work. Not tighter: on a shared
# machine the probe and the kernel run at different moments (single-thread streams varied 19-31 GB/s within
# minutes here), and a working set just past twice the last-level cache still partly hits in a victim L3.
ROOFLINE_MARGIN = 2.0


# What to do next after each way a profile can fail (the rest share the last line).
FAILURE_NEXT_STEPS: dict[str, str] = {
    "timing_unverified": "the kernel's timing stream broke the measurement protocol (a claimed interval outside the "
                         "trusted stamps, or batches out of schedule): a kernel must not write to descriptors it did "
                         "not open or patch the harness; remove that and profile again",
    "interfered": "the kernel changed how a process it is compared with is scheduled: a kernel must only compute its "
                  "outputs; remove the system calls that touch other processes and recompile",
    "wrong_at_profile_size": "the kernel is wrong or crashes at the profiling size although it passed the small "
                             "cases: make it correct for every size (no special cases by size or by pointer), "
                             "recompile and test again",
}


def profile_failure(task: Task, outcome: HarnessOutcome, sets: list[PreparedCase], expected: list[list[np.ndarray]],
                    profile: CaseSpec | None = None,
                    variants: Iterable[tuple[PreparedCase, list[np.ndarray]]] | None = None,
                    ) -> tuple[ProfileFailure | None, str]:
    """Why a profile is not a measurement (wrong or crashing at the profiling size, ...), or (None, "").

    Wrong outputs come before unverified timings: they were read back by the coordinator whatever the timing
    stream said, and "wrong" tells the agent what to fix where "profile again" would not."""
    sizes = sets[0].sizes
    if outcome.status == "load_error":
        return "load_error", outcome.message
    if outcome.status == "tampered":
        return "interfered", outcome.message
    if outcome.status not in ("ok", "unverified"):
        return "crash_at_profile_size", f"at the profiling size {sizes}: {outcome.message}"
    if outcome.result.get("inconsistent_calls"):
        return "wrong_at_profile_size", (
            f"{outcome.result['inconsistent_calls']} timed call(s) at the profiling size {sizes} did not "
            f"reproduce the kernel's own result on the same inputs ({outcome.result.get('inconsistency')}): "
            "a kernel must compute every call in full (no caching by pointer, no skipping outputs that "
            "look written)")
    if outcome.result.get("inputs_modified"):
        return "wrong_at_profile_size", (f"the kernel wrote into input(s) {outcome.result['inputs_modified']} "
                                         f"at the profiling size {sizes}: inputs are read-only")
    names = [a.name for a in task.outputs()]
    checked = checked_sets(outcome.result, len(sets)) if outcome.outputs else []
    judged = itertools.chain(((sets[i], expected[i], False) for i in checked),
                             ((c, e, True) for c, e in variants or ()))  # a variant is made when it is judged
    for (case, exp, varied), got in zip(judged, outcome.outputs, strict=True):
        result, failure = judge_case(case.name, case.sizes, got, exp, names,
                                     task.spec.tolerance_for(profile or task.spec.profile), [])
        if failure is not None:
            where = (f"; {result.mismatches} element(s) wrong, first at flat index {result.first_bad_index} of "
                     f"{result.first_bad_output!r} (expected {result.expected}, got "
                     f"{'NaN' if result.got is None else result.got})") if result.mismatches else ""
            if varied:
                return "wrong_at_profile_size", (
                    f"a timed call at the profiling size {sizes} on a variant of an input set it had run before (every "
                    f"input scaled element by element) does not match the reference{where}: a kernel must compute "
                    "every call from its inputs (no result kept from an earlier call, whatever it is keyed by)")
            return "wrong_at_profile_size", (
                f"the outputs of timed calls at the profiling size {sizes} do not match the reference"
                f"{where}; the small test cases passed, so look for size-dependent paths")
    if outcome.status == "unverified":
        return "timing_unverified", outcome.message
    return None, ""


# CPU time over the wall time of the windows the candidate was allowed to run in (it is stopped outside them) above
# which a kernel given one CPU ran on others too: one thread cannot exceed 1, whatever the harness's own Python
# around the calls costs. Below 20 ms of windows the comparison says little.
ESCAPED_CPU_RATIO = 1.3
MIN_ACCOUNTED_S = 0.02


def measured_threads(result: dict[str, object], cpus_given: int, declared: int) -> tuple[int, list[str]]:
    """The CPUs the candidate actually kept busy while it was allowed to run (its process's CPU time over the wall
    time of those windows), and the integrity reasons when that is more than it was given or it widened its own
    CPU mask."""
    cpu, wall = result.get("cpu_seconds"), result.get("window_seconds")
    reasons = []
    threads = declared
    if isinstance(cpu, int | float) and isinstance(wall, int | float) and wall >= MIN_ACCOUNTED_S:
        ratio = cpu / wall
        threads = max(1, round(ratio))
        if cpus_given == 1 and ratio > ESCAPED_CPU_RATIO:
            reasons.append(f"the kernel kept {ratio:.1f} CPUs busy while it ran but was given one: it ran "
                           "threads outside its CPU mask, so its speedup is not a single-thread result")
    if result.get("cpu_mask_widened"):
        reasons.append("the kernel widened its CPU mask beyond the CPU it was given")
    return threads, reasons


# CPU time the candidate may spend outside its timed calls. Loading (the library, its constructors, the worker
# around them) is compared with the naive baseline's, measured the same way in the same run, so that a busy or slow
# machine moves both: up to LOAD_FACTOR times it plus LOAD_FLOOR_S (a few clock ticks and the OpenMP runtime).
# The warm-up call may take WARMUP_CALLS typical calls plus WARMUP_FLOOR_S (a cold cache, first-touch faults, a
# thread team started). More is work done where it is not timed: results computed ahead in a constructor or the
# warm-up call and replayed while timed, or tuning whose cost the timed calls never carry. Without the baseline's
# figures (a GPU profile, a profile against the reference) the fixed allowance of old applies to the sum.
LOAD_FACTOR, LOAD_FLOOR_S, WARMUP_CALLS, WARMUP_FLOOR_S = 2.0, 0.05, 5, 0.05
UNTIMED_SLACK_S, UNTIMED_CALLS, FILL_BYTES_PER_S = 0.15, 5, 0.5e9


def untimed_work_reasons(result: dict[str, object], median_call_s: float, threads: int) -> list[str]:
    """Why the candidate's CPU outside its timed calls is more than loading and a warm-up call take (none: it
    is not). ``median_call_s`` and ``threads`` are the candidate's measured ones."""
    untimed = _number(result.get("untimed_cpu_seconds"))
    if untimed is None:
        return []
    warmup = _number(result.get("warmup_cpu_seconds"))
    base_untimed = _number(result.get("baseline_untimed_cpu_seconds"))
    base_warmup = _number(result.get("baseline_warmup_cpu_seconds"))
    if warmup is None or base_untimed is None or base_warmup is None:
        filled = _number(result.get("filled_bytes"))
        allowed = UNTIMED_SLACK_S + UNTIMED_CALLS * median_call_s * max(1, threads) + (filled or 0.0) / FILL_BYTES_PER_S
        if untimed <= allowed:
            return []
        return [f"the kernel's process used {untimed:.2f} s of CPU outside its timed calls (loading and the warm-up "
                f"call allow about {allowed:.2f} s): work done where it is not timed, such as results computed ahead"]
    reasons = []
    loading, base_loading = max(0.0, untimed - warmup), max(0.0, base_untimed - base_warmup)
    allowed_load = LOAD_FLOOR_S + LOAD_FACTOR * base_loading
    if loading > allowed_load:
        reasons.append(f"loading the kernel's library used {loading:.3f} s of CPU, the naive baseline's "
                       f"{base_loading:.3f} s in the same run: work done at load, where nothing is timed, such as "
                       "results computed ahead")
    calls, cpu = _number(result.get("candidate_calls")), _number(result.get("cpu_seconds"))
    typical = max(median_call_s * max(1, threads), cpu / max(1.0, calls - 1) if cpu and calls else 0.0)
    allowed_warmup = WARMUP_FLOOR_S + WARMUP_CALLS * typical
    if warmup > allowed_warmup:
        reasons.append(f"the kernel's first (untimed) call used {warmup:.3f} s of CPU, {warmup / typical:.0f}x its "
                       f"typical timed call ({typical * 1e3:.3g} ms): work done where it is not timed"
                       if typical > 0 else f"the kernel's first (untimed) call used {warmup:.3f} s of CPU")
    return reasons


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def suspect_reasons(speedup_ci: tuple[float, float], flops: int, nbytes: int, median: float, threads: int,
                     hardware: HardwareProfile | None) -> list[str]:
    """Integrity signals: a result that trips one is recorded but never taught as a win. ``hardware`` is the CPU
    whose peaks bound a plausible result (None: the target has no such bound)."""
    reasons = []
    if speedup_ci[0] <= 1.0 <= speedup_ci[1]:
        reasons.append(f"the speedup's 95% CI [{speedup_ci[0]:.3f}, {speedup_ci[1]:.3f}] contains 1")
    if hardware is None:
        return reasons
    peak = peak_gflops(hardware, threads)
    if flops and flops / median / 1e9 > peak:
        reasons.append(f"{flops / median / 1e9:.0f} GFLOP/s is above this machine's float32 peak "
                       f"(~{peak:.0f} GFLOP/s on {threads} thread(s))")
    beyond = beyond_memory_roof(nbytes, median, threads, hardware)
    if beyond is not None:
        reasons.append(f"{beyond[0]:.1f} GB/s is above what this machine streams over a working set of "
                       f"{nbytes / 2**20:.0f} MiB (~{beyond[1]:.1f} GB/s on {threads} thread(s), measured at that "
                       "size): more than its memory and caches can move")
    return reasons


def beyond_memory_roof(nbytes: int, median: float, threads: int,
                       hardware: HardwareProfile | None) -> tuple[float, float] | None:
    """(achieved, streamed) GB/s when a working set of ROOF_MIN_BYTES or more moved more than ROOFLINE_MARGIN
    times faster than this machine's fastest measured stream over a working set of that size (per thread); else
    None (and for a target with no CPU bound). The bandwidth is probed again before saying so: a probe on a busy
    machine reads low."""
    if hardware is None or nbytes < ROOF_MIN_BYTES:
        return None
    achieved = nbytes / median / 1e9
    for again in (False, True):
        streamed = streaming_bandwidth_gbps(again=again, footprint=nbytes) * threads
        if achieved <= streamed * ROOFLINE_MARGIN:
            return None
    return achieved, streamed


def same_source_as_baseline(source: str, flags: list[str], baseline: str | None, default_flags: list[str]) -> bool:
    """The baseline's own source (but for trailing spaces and blank lines: indentation is code in Python and
    Triton), built with no flag beyond the target's defaults: the contract's test, for every target, that a
    speedup measured is placement or noise and never a win. A target that can compare machine code (C) also
    catches the baseline's code moved around; one that cannot, a pure Python fake here, had its baseline's own
    code measured "effective" against itself under load (a noisy measurement whose CI still cleared 1.05)."""
    return (baseline is not None and _lines(source) == _lines(baseline)
            and set(flags) <= set(default_flags))


def _lines(source: str) -> list[str]:
    return [line.rstrip() for line in source.splitlines() if line.strip()]


def noise_reasons(ratio_riqr: float, conservative: str) -> list[str]:
    """Why a measurement is too imprecise to teach ([] for a clean one). ``ratio_riqr``: the relative IQR of the
    per-round speedups."""
    reasons = []
    if not ratio_riqr <= NOISY_RATIO_IQR:
        reasons.append(f"the per-round speedups vary by {ratio_riqr:.0%} (interquartile range over median, more than "
                       f"{NOISY_RATIO_IQR:.0%}): other work on this machine made the samples vary")
    if conservative:
        reasons.append(f"the machine was too busy to corroborate the kernel's own clock ({conservative}): it was "
                       "charged the trusted timekeeper's windows instead, which can only make it look slower")
    return reasons


def profile_warnings(kernel_riqr: float, base_riqr: float, speedup: float, speedup_ci: tuple[float, float],
                      nbytes: int, median: float, threads: int, hardware: HardwareProfile | None,
                      naive_baseline: bool = True) -> list[str]:
    warnings = []
    if max(kernel_riqr, base_riqr) > NOISY_RELATIVE_IQR:
        warnings.append(f"variable timings: relative IQR {kernel_riqr:.1%} (kernel) / {base_riqr:.1%} (baseline); "
                        "another process may be busy, profile again before trusting small differences")
    if speedup > IMPLAUSIBLE_SPEEDUP and naive_baseline:
        warnings.append(f"large speedup {speedup:.1f}x over the naive baseline (the timed calls' outputs were checked "
                        "at the profiling size): the naive baseline is far from a good kernel here; "
                        "speedup_vs_reference says how this one compares with numpy")
    if speedup_ci[0] < 1.0 < speedup_ci[1]:
        warnings.append(f"the speedup's 95% CI [{speedup_ci[0]:.3f}, {speedup_ci[1]:.3f}] contains 1: not "
                        "measurably different from the baseline")
    beyond = beyond_memory_roof(nbytes, median, threads, hardware)
    if beyond is not None:
        warnings.append(f"faster than the memory roofline: {beyond[0]:.1f} GB/s moved vs about {beyond[1]:.1f} GB/s "
                        f"this machine streams over a working set of that size ({threads} thread(s)); suspicious")
    if threads > 1:
        warnings.append(f"the kernel kept {threads} CPUs busy (measured); the baseline and reference are "
                        "single-threaded")
    return warnings


_FAILURE_ORDER: tuple[FailureKind, ...] = ("crash", "timeout", "out_of_bounds_write", "input_modified", "wrong_shape",
                                           "nan", "mismatch")


def worst_failure(failures: list[tuple[FailureKind, CaseResult]]) -> FailureKind | None:
    kinds = {f for f, _ in failures}
    return next((k for k in _FAILURE_ORDER if k in kinds), None)


def test_message(passed: bool, failure: FailureKind | None, cases: list[CaseResult], task: Task,
                 drawn: bool = True) -> str:
    if passed:
        return (f"all {len(cases)} cases passed within the tolerance ({SEEDS_PER_CASE} seeds each"
                f"{'; the case drawn near the profiling size once' if drawn else ''})")
    bad = [c for c in cases if not c.passed]
    first = bad[0]
    parts = [f"{len(bad)} of {len(cases)} cases failed; first: {first.name!r} with sizes {first.sizes}"]
    if first.out_of_bounds:
        parts.append(f"the kernel wrote outside its buffers: {'; '.join(first.out_of_bounds)} (an unmasked tail? "
                     "every load and store past the last element must be masked or bounds-checked)")
    if failure == "input_modified":
        parts.append(f"the kernel wrote into input(s) {', '.join(first.inputs_modified)}: inputs are read-only")
    if first.mismatches:
        parts.append(f"{first.mismatches} element(s) wrong, first at flat index {first.first_bad_index} of "
                     f"{first.first_bad_output!r} (expected {first.expected}, got "
                     f"{'NaN' if first.got is None else first.got})")
    if first.unwritten:
        parts.append(f"{first.unwritten} element(s) were never written (still NaN poison): a missing tail loop or "
                     "a loop bound that stops early?")
    elif failure == "nan":
        parts.append("the kernel produced NaN or infinity where the reference is finite (overflow in exp? "
                     "division by zero? uninitialised accumulator?)")
    return "; ".join(parts)
