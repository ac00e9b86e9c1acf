"""The pre-registered analysis: power before results, Holm over the windows, the A/A control, the judge's curve."""

import math

from kope_mcp.bench.agent import TaskRun
from kope_mcp.bench.analysis import aa_control, design_and_power, near_best, primary, verdict_counts
from kope_mcp.bench.judge import judged_curve, kernel_key
from kope_mcp.bench.metrics import holm, minimum_detectable, pairs_needed, sign_flip_p, sign_flip_power


def run(task: str, arm: str, curve: list[float], seed: int = 0, strategies: list[str] | None = None) -> TaskRun:
    return TaskRun(task_id=task, family="f", policy=arm, seed=seed, budget=len(curve), attempts=len(curve),
                   first_correct=1, best_speedup=max(curve), best_by_attempt=curve, strategies=strategies or [])


def test_the_sign_flip_test_is_exact_for_few_pairs_and_symmetric():
    assert sign_flip_p([1.0] * 6) == 2 / 64  # only all-plus and all-minus are as extreme
    assert sign_flip_p([1.0, -1.0] * 3) == 1.0
    assert 0.0 < sign_flip_p([0.3, 0.1, -0.05] * 10) < 0.05
    assert math.isnan(sign_flip_p([]))


def test_holm_multiplies_the_smallest_p_by_m_and_keeps_the_adjusted_order_monotone():
    assert holm([0.01, 0.04, 0.03]) == [0.03, 0.06, 0.06]
    assert holm([0.5, 0.9]) == [1.0, 1.0]


def test_the_power_figures_need_about_a_hundred_pairs_for_one_attempt_at_sd_three_over_four_windows():
    assert 90 < pairs_needed(3.0, 1.0, comparisons=4) < 130
    assert minimum_detectable(3.0, 11, comparisons=4) > 2.5  # the earlier 11-task run could not see 1 attempt


def test_the_detectable_difference_is_the_exact_sign_flip_tests_not_the_normal_approximations():
    # The audit's figure for the report's own test at 11 pairs over 4 windows: 1.245 SD (the normal said 1.01).
    assert 1.18 < minimum_detectable(1.0, 11, comparisons=4) < 1.31
    assert minimum_detectable(1.0, 7, comparisons=4) == math.inf  # 2 / 2^7 > 0.0125: no result possible
    assert minimum_detectable(0.5, 11, comparisons=4) == minimum_detectable(1.0, 11, comparisons=4) / 2
    # With no noise between arms the fewest pairs that can reach the level at all are enough.
    assert pairs_needed(0.0, 0.1, comparisons=4) == 8


def test_the_simulated_power_holds_the_level_under_the_null_and_rises_with_the_shift():
    assert sign_flip_power(0.0, 10, 0.05) <= 0.06
    assert sign_flip_power(0.5, 10, 0.05) < sign_flip_power(1.0, 10, 0.05) < sign_flip_power(1.5, 10, 0.05)
    assert sign_flip_power(0.5, 40, 0.05) > sign_flip_power(0.5, 10, 0.05)  # drawn signs past 12 pairs


def test_the_design_section_states_pairs_and_detectable_difference_before_any_result():
    by_arm = {"active@8k": [run(f"t{i}", "active@8k", [1.0, 3.0 + i % 3]) for i in range(8)],
              "passive@8k": [run(f"t{i}", "passive@8k", [1.0, 2.0]) for i in range(8)]}
    best = {f"t{i}": 4.0 for i in range(8)}
    lines = design_and_power(by_arm, ("passive@8k", "active@8k"), near_best(best, 2))
    assert "fewer than 6 pairs" in "\n".join(lines)  # 2 / 2^6 <= 0.05 < 2 / 2^5
    row = next(line for line in lines if line.startswith("| 8k |"))
    assert row.split(" | ")[1] == "8"
    result = "\n".join(primary(by_arm, ("passive@8k", "active@8k")))
    assert "| 8k | +" in result and "active better" in result


def test_the_a_a_control_says_whether_it_tied_static():
    same = {"static": [run(f"t{i}", "static", [1.0, 2.0], strategies=["a"]) for i in range(6)],
            "aa@8k": [run(f"t{i}", "aa@8k", [1.0, 2.0], strategies=["a"]) for i in range(6)]}
    text = "\n".join(aa_control(same, ("static", "aa@8k"), near_best({f"t{i}": 2.0 for i in range(6)}, 2)))
    assert "Equivalent to static" in text and "in 6 of 6" in text and "paired SD 0.000" in text
    skewed = {"static": same["static"], "aa@8k": [run(f"t{i}", "aa@8k", [1.0, 1.0]) for i in range(6)]}
    text = "\n".join(aa_control(skewed, ("static", "aa@8k"), near_best({f"t{i}": 2.0 for i in range(6)}, 2)))
    assert "Not shown equivalent to static" in text
    # A difference within the margin but with a CI reaching past it is not a tie either: noise that large could
    # hide the effect of interest.
    noisy = {"static": same["static"],
             "aa@8k": [run(f"t{i}", "aa@8k", [1.0, 2.0 * (1.5 if i % 2 else 1 / 1.5)]) for i in range(6)]}
    text = "\n".join(aa_control(noisy, ("static", "aa@8k"), near_best({f"t{i}": 2.0 for i in range(6)}, 2)))
    assert "Not shown equivalent to static" in text
    few = {arm: runs[:2] for arm, runs in skewed.items()}
    text = "\n".join(aa_control(few, ("static", "aa@8k"), near_best({f"t{i}": 2.0 for i in range(6)}, 2)))
    assert "Too few pairs to judge" in text


def test_the_judged_curve_follows_the_incumbent_through_the_judges_figures():
    r = run("t", "active@8k", [1.0, 3.0, 3.0, 5.0])
    r.kept = [[0, "naive", []], [2, "fast", ["-O3"]], [4, "faster", ["-O3"]]]
    figures = {kernel_key("fast", ["-O3"]): 2.5, kernel_key("faster", ["-O3"]): 2.4}
    assert judged_curve(r, figures) == [1.0, 2.5, 2.5, 2.4]  # the judge's figure, even where it is lower
    r.judged = judged_curve(r, figures)
    assert r.curve == r.judged and r.final == 2.4


def test_the_verdict_table_counts_suspect_and_noisy_profiles_per_arm():
    r = run("t", "passive@8k", [1.0, 1.0])
    r.outcomes, r.verdicts = {"correct": 2}, {"noisy": 1, "suspect": 2}
    text = "\n".join(verdict_counts({"passive@8k": [r]}, ("passive@8k",)))
    assert "| passive@8k | 2 | 2 | 1 | 0 |" in text
