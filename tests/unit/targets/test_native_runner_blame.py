"""Whose fault a profile run that never finished is: the coordinator's marks, which no worker can write, say."""

from __future__ import annotations

from kope_mcp.runtime.sandbox import SandboxResult
from kope_mcp.targets.native_runner import _classify_death


def _ended(timed_out: bool, returncode: int | None = None) -> SandboxResult:
    return SandboxResult(returncode=returncode, timed_out=timed_out, wall_seconds=72.0, stdout_tail="",
                         stderr_tail="", uid=0)


def test_a_profile_that_hangs_in_the_baseline_is_the_baselines_failure_not_the_kernels():
    progress = ["warmup", "run candidate", "run baseline", "measure", "run baseline", "run candidate", "run baseline"]
    status, message, _ = _classify_death(_ended(True), progress, profile=True)
    assert status == "baseline_failed" and message.startswith("the baseline was killed after the wall-clock limit")


def test_a_profile_that_hangs_in_the_candidate_is_the_kernels_timeout():
    status, message, case = _classify_death(_ended(True), ["warmup", "run baseline", "measure", "run candidate"],
                                            profile=True)
    assert status == "timeout" and "wall-clock" in message and case == "measure"


def test_a_test_run_that_hangs_is_the_kernels_timeout_at_its_case():
    status, message, case = _classify_death(_ended(True), ["start 3 odd_127"])
    assert status == "timeout" and case == "odd_127" and "odd_127" in message


def test_a_test_runs_kernel_cannot_blame_the_baseline_by_writing_the_coordinators_marks():
    # In a test run the kernel shares the harness's process, and with it the progress descriptor.
    status, _, case = _classify_death(_ended(True), ["start 0 one", "run baseline"])
    assert status == "timeout" and case == "one"
