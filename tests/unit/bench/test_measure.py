"""One shared figure per distinct kernel: its interval and stop rule, the decision every arm makes on it, and the
report's count of kernels decided on different figures."""

import math
from types import SimpleNamespace
from typing import Any

import anyio

from kope_mcp.bench.agent import TaskRun
from kope_mcp.bench.measure import Figure, MeasureConfig, SharedMeasure, log_interval, measurably_faster
from kope_mcp.bench.noise import decisions_section, not_results, split_decisions, without_failures


class ScriptedServer:
    """Stands in for a `kope serve` whose profiles return the figures given, in order (the real one's noise
    cannot be scripted); it answers compile and test as the real one does for a correct kernel."""

    def __init__(self, figures: list[float | None]) -> None:
        self.figures = list(figures)
        self.calls: list[str] = []

    async def call_tool(self, name: str, args: dict[str, Any]) -> Any:
        self.calls.append(name)
        answer: dict[str, Any] = {"compile_kernel": {"ok": True, "kernel_id": "k-1"},
                                  "run_tests": {"passed": True}}.get(name, {})
        if name == "profile_kernel":
            figure = self.figures.pop(0)
            answer = {"failure": "wrong_at_profile_size"} if figure is None else {"speedup_vs_baseline": figure}
        return SimpleNamespace(is_error=False, structured_content=answer, content=[])


def test_the_interval_is_a_t_interval_on_the_logs_of_the_profiles():
    centre, low, high = log_interval([2.0, 2.0, 2.0])
    assert centre == low == high == 2.0
    centre, low, high = log_interval([1.9, 2.1])
    assert low < centre < high and math.isclose(centre, math.sqrt(1.9 * 2.1))
    assert math.isclose(centre / low, high / centre)
    assert all(math.isclose(v, 3.0) for v in log_interval([3.0]))  # one profile: no interval


def test_profiling_stops_once_the_interval_is_within_the_width_and_is_never_repeated(tmp_path):
    server = ScriptedServer([2.0, 2.1, 2.0, 2.02, 9.0])
    measure = SharedMeasure(server, tmp_path / "measured.json", MeasureConfig(width=0.05, max_profiles=6))
    figure = anyio.run(measure.figure, "t", "src", ["-O2"])
    # 5% apart, two profiles leave +-31%; three +-7%; the fourth brings it to +-4%
    assert figure.figures == [2.0, 2.1, 2.0, 2.02] and figure.half_width <= 0.05
    again = anyio.run(measure.figure, "t", "src", ("-O2",))
    assert again == figure and server.calls.count("profile_kernel") == 4
    # A resumed run reads the same figure from the run's folder without profiling.
    reread = SharedMeasure(ScriptedServer([]), tmp_path / "measured.json")
    assert anyio.run(reread.figure, "t", "src", ["-O2"]) == figure


def test_a_noisy_kernel_stops_at_the_cap_with_its_wide_interval_and_a_wrong_one_fails_for_every_arm(tmp_path):
    noisy = SharedMeasure(ScriptedServer([1.0, 1.5, 1.0, 1.5]), tmp_path / "a.json",
                          MeasureConfig(width=0.05, max_profiles=4))
    figure = anyio.run(noisy.figure, "t", "src", [])
    assert len(figure.figures) == 4 and figure.half_width > 0.05 and figure.low < 1.0
    assert not measurably_faster(figure, 1.0)  # its interval reaches below the naive kernel
    wrong = SharedMeasure(ScriptedServer([2.0, None]), tmp_path / "b.json")
    figure = anyio.run(wrong.figure, "t", "src", [])
    assert figure.speedup is None and figure.failure == "wrong_at_profile_size"


def test_a_candidate_is_kept_only_when_its_intervals_low_end_clears_the_incumbent():
    figure = Figure(2.0, 1.9, 2.1, [1.9, 2.1])
    assert measurably_faster(figure, 1.8) and not measurably_faster(figure, 1.95)
    assert not measurably_faster(Figure(2.0, 1.9, 2.1, suspect=True), 1.0)
    assert not measurably_faster(Figure(None, failure="timing_unverified"), 1.0)


def run(arm: str, decisions: list[list[Any]], task: str = "t", error: str = "") -> TaskRun:
    return TaskRun(task_id=task, family="f", policy=arm, seed=0, budget=2, decisions=decisions, error=error)


def test_the_report_counts_pairs_of_arms_that_decided_one_kernel_on_different_figures():
    one = {"static": [run("static", [[1, "t/a", 2.0, 1.9, True]])],
           "aa@8k": [run("aa@8k", [[1, "t/a", 2.0, 1.9, True]])],
           "passive@8k": [run("passive@8k", [[1, "t/a", 2.0, 1.9, True], [2, "t/b", 3.0, 2.9, True]])]}
    assert split_decisions(one) == (1, 3, 0)
    text = "\n".join(decisions_section(one, {"t/a": {"speedup": 2.0, "low": 1.9, "high": 2.1,
                                                       "figures": [1.9, 2.1]}}))
    assert "pairs decided on different figures: 0" in text
    own = {"static": one["static"], "aa@8k": [run("aa@8k", [[1, "t/a", 2.2, 1.8, True]])]}
    assert split_decisions(own) == (1, 1, 1)


def test_a_failed_run_leaves_its_task_out_for_every_arm_and_is_named():
    by_arm = {"static": [run("static", [], "t1"), run("static", [], "t2")],
              "active@8k": [run("active@8k", [], "t1", error="ToolFailed: compile_kernel: empty_source"),
                            run("active@8k", [], "t2")]}
    kept = without_failures(by_arm)
    assert [r.task_id for r in kept["static"]] == ["t2"] == [r.task_id for r in kept["active@8k"]]
    text = "\n".join(not_results(by_arm, {"kb_1": "no naive C baseline"}))
    assert "`active@8k` on `t1`: ToolFailed: compile_kernel: empty_source" in text and "`kb_1`" in text
