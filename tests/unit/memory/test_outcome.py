import pytest

from kope_mcp.memory.outcome import downstream, label_for, measurement_confidence, step_ratio


@pytest.mark.parametrize("ratio,label", [
    (1.05, "effective"), (2.0, "effective"), (1.0, "partial"), (1.049, "partial"),
    (0.85, "ineffective"), (0.95, "ineffective"), (0.96, "partial"), (0.999, "partial"), (0.849, "negative"),
    (0.1, "negative"),
])
def test_label_thresholds_follow_the_paper(ratio, label):
    assert label_for(True, True, ratio) == label


def test_identical_work_measured_a_percent_slower_with_a_tight_ci_is_no_pitfall():
    # The naive kernel against its own baseline, sampled until its CI is within 1.5%: 0.99x, CI 0.985-0.995.
    assert label_for(True, True, 0.99, (0.985, 0.995)) == "partial"
    assert label_for(True, True, 0.93, (0.90, 0.95)) == "ineffective"


def test_incorrect_and_uncompiled_never_promote_whatever_the_ratio():
    assert label_for(True, False, 5.0) == "incorrect"
    assert label_for(False, None, 5.0) == "compile_error"
    assert label_for(True, True, None) == "unmeasured"


def test_step_ratio_is_relative_to_the_predecessor_and_roots_to_the_baseline():
    assert step_ratio(3.0, 2.0) == 1.5
    assert step_ratio(3.0, None) == 3.0


def test_downstream_score_credits_successors_with_decay():
    assert downstream(1.2, []) == pytest.approx(0.6)
    assert downstream(0.0, [1.0, 0.6]) == pytest.approx(0.5 * 0.7 * 1.6)


def test_confidence_falls_with_a_wide_interval_and_noise():
    tight = measurement_confidence(2.0, (1.98, 2.02), noisy=False)
    wide = measurement_confidence(2.0, (1.5, 2.5), noisy=False)
    assert tight > wide
    unsure = measurement_confidence(1.02, (0.99, 1.05), noisy=False)
    assert measurement_confidence(1.02, (0.99, 1.05), noisy=True) == pytest.approx(unsure / 2, abs=1e-4)


def test_a_win_measurably_above_1_keeps_half_confidence_on_a_noisy_machine():
    assert measurement_confidence(2.0, (1.98, 2.02), noisy=True) == 0.5
    assert measurement_confidence(3.0, (1.1, 6.0), noisy=True) == 0.5
    assert measurement_confidence(1.5, (0.7, 3.0), noisy=True) < 0.5
