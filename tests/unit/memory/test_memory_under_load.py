"""What a busy machine's verdicts teach: a win whose whole CI clears the gain threshold, however wide; nothing
else that is noisy; and never the baseline's own code, which is no step's base either."""

from __future__ import annotations

from kope_mcp.models import CaseInfo, ProfileReport, TimingStats
from tests.memory_helpers import SUM_ACCUMULATORS, SUM_NAIVE


def _stats(median: float) -> TimingStats:
    return TimingStats(median_s=median, iqr_s=median / 2, ci95_low_s=median / 2, ci95_high_s=median * 2, n=9,
                       calls_per_sample=4, relative_iqr=0.5)


def _report(workbench, kernel_id: str, speedup: float, ci: tuple[float, float], *, noisy: bool,
            suspect: bool = False, same_code: bool = False) -> ProfileReport:
    return ProfileReport(
        kernel_id=kernel_id, task_id="sum_reduce", case=CaseInfo(name="profile", sizes={"n": 1}),
        kernel=_stats(1e-3 / speedup), baseline=_stats(1e-3), speedup_vs_baseline=speedup,
        speedup_vs_baseline_ci95=ci, threads=1, pinned_cpu=0, rounds=9, measure_seconds=1.0,
        hardware=workbench.target("c").hardware(), noisy=noisy,
        noise_reasons=["the per-round speedups vary by 80%"] if noisy else [], suspect=suspect or same_code,
        suspect_reasons=["the baseline's own code"] if same_code else [], same_code_as_baseline=same_code,
        warnings=[], next_step="")


def _tested(workbench, source: str, **kwargs) -> str:
    compiled = workbench.compile_kernel("sum_reduce", source, **kwargs)
    assert workbench.run_tests(compiled.kernel_id).passed
    return compiled.kernel_id


def test_a_noisy_win_whose_whole_ci_clears_the_threshold_is_taught_with_its_ci(workbench):
    naive = _tested(workbench, workbench.tasks.get("sum_reduce").baseline_source, strategy="the baseline itself")
    workbench.memory.record_profile(naive, _report(workbench, naive, 1.09, (0.95, 1.2), noisy=True, same_code=True))
    fast = _tested(workbench, SUM_ACCUMULATORS, parent_id=naive, strategy="accumulators",
                   session_id=workbench.store.attempt(naive).session_id, flags=["-O3"])
    workbench.memory.record_profile(fast, _report(workbench, fast, 3.0, (1.4, 6.0), noisy=True))
    record = workbench.store.attempt(fast)
    # Measured from the naive baseline (speedup 1), not from its own code's placement reading of 1.09.
    assert record.step_ratio == 3.0 and record.label == "effective" and record.teaches, record
    assert any("measured under load" in w and "[1.40, 6.00]" in w for w in record.profile_warnings)
    baseline_code = workbench.store.attempt(naive)
    assert baseline_code.suspect and not baseline_code.teaches and baseline_code.label == "ineffective"
    session = workbench.store.session(record.session_id)
    assert session.incumbent_id == fast


def test_a_noisy_result_whose_ci_does_not_clear_the_threshold_teaches_nothing(workbench):
    kernel_id = _tested(workbench, SUM_NAIVE, strategy="a serial loop of my own")
    workbench.memory.record_profile(kernel_id, _report(workbench, kernel_id, 1.6, (1.01, 2.5), noisy=True))
    record = workbench.store.attempt(kernel_id)
    assert record.label == "partial" and record.noisy and not record.teaches
    workbench.memory.record_profile(kernel_id, _report(workbench, kernel_id, 3.0, (1.4, 6.0), noisy=True,
                                                       suspect=True))
    assert not workbench.store.attempt(kernel_id).teaches  # suspect: never taught, however clear the CI
