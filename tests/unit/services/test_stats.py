import numpy as np
import pytest

from kope_mcp.services.stats import median_ci95, paired_speedup, summarize


def test_summary_has_median_iqr_and_a_ci_that_contains_the_median():
    samples = list(np.random.default_rng(0).normal(1.0, 0.01, 200))
    stats = summarize(samples, calls_per_sample=3)
    assert stats.median_s == pytest.approx(1.0, abs=0.005)
    assert stats.ci95_low_s < stats.median_s < stats.ci95_high_s
    assert 0.005 < stats.iqr_s < 0.02 and stats.n == 200 and stats.calls_per_sample == 3


def test_ci_narrows_with_more_samples():
    rng = np.random.default_rng(1)
    small, large = median_ci95(rng.normal(0, 1, 20)), median_ci95(rng.normal(0, 1, 2000))
    assert (large[1] - large[0]) < (small[1] - small[0])


def test_paired_speedup_cancels_drift_shared_by_both_series():
    drift = np.linspace(1.0, 2.0, 50)  # the machine slows down during the run
    slow, fast = list(4.0 * drift), list(1.0 * drift)
    speedup, (lo, hi) = paired_speedup(slow, fast)
    assert speedup == pytest.approx(4.0) and lo == pytest.approx(4.0) and hi == pytest.approx(4.0)
