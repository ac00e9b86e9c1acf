"""The protocol's stopping rule, driven by a device whose clock is scripted: how long sampling goes on depends on
how noisy the paired ratios are, never on one implementation's samples alone."""

from __future__ import annotations

import time

import numpy as np
import pytest

from kope_mcp.runtime.measurement import Consistency, Schedule, measure, median_ci95, ratio_ci_width


class ScriptedClock:
    """Each batch takes ``step_s`` of real time and reports 1 ms per call times a factor drawn with ``noise``
    (relative sigma), for both implementations alike: identical code on a machine as quiet or busy as asked."""

    def __init__(self, noise: float, step_s: float = 0.0005, seed: int = 1) -> None:
        self.noise, self.step_s = noise, step_s
        self.rng = np.random.default_rng(seed)

    def poison(self, name: str, n: int) -> None:
        pass

    def run(self, name: str, chosen: list[int], variants: list[int] | None = None) -> float:
        time.sleep(self.step_s)
        return 0.001 * float(np.exp(self.rng.normal(0.0, self.noise)))

    def read(self, n: int) -> list[dict[str, np.ndarray]]:
        return [{"out": np.zeros(4, dtype=np.float32)} for _ in range(n)]


def _measure(noise: float, cap: float) -> tuple[float, float, int]:
    measured = measure(ScriptedClock(noise), ["candidate", "baseline"], set_count=2, buffers=1,
                       schedule=Schedule(time_cap_s=cap), checks=Consistency(0.0, 0.0))
    width = ratio_ci_width(measured.samples["baseline"], measured.samples["candidate"])
    return measured.seconds, width, measured.rounds


def test_quiet_samples_stop_early_after_the_minimum_rounds() -> None:
    seconds, _, rounds = _measure(noise=0.001, cap=5.0)
    assert rounds == Schedule(time_cap_s=5.0).min_rounds
    assert seconds < 5.0


def test_noisy_ratios_keep_sampling_past_the_cap_until_their_ci_is_narrow_or_the_noisy_cap() -> None:
    schedule = Schedule(time_cap_s=0.1)
    seconds, width, _ = _measure(noise=0.10, cap=0.1)
    assert seconds >= 0.1
    # Either the CI reached the goal (after the cap) or sampling ran to the noisy cap and reports what it reached.
    assert width <= schedule.ratio_ci_goal or seconds >= 0.1 * schedule.noisy_cap_factor
    assert seconds < 0.1 * schedule.noisy_cap_factor + 1.0


def test_very_noisy_ratios_end_at_the_noisy_cap_rather_than_run_on() -> None:
    schedule = Schedule(time_cap_s=0.05)
    seconds, width, _ = _measure(noise=0.5, cap=0.05)
    assert width > schedule.ratio_ci_goal
    assert 0.05 * schedule.noisy_cap_factor <= seconds < 0.05 * schedule.noisy_cap_factor + 1.0


@pytest.mark.parametrize("n", [1, 5, 40, 400])
def test_the_ratio_ci_width_is_measured_from_the_median_of_the_pairs(n: int) -> None:
    rng = np.random.default_rng(n)
    slow, fast = list(rng.uniform(1.0, 1.2, n)), list(rng.uniform(1.0, 1.2, n))
    ratios = np.asarray(slow) / np.asarray(fast)
    lo, hi = median_ci95(ratios)
    median = float(np.median(ratios))
    assert ratio_ci_width(slow, fast) == pytest.approx(max(median - lo, hi - median) / median)
    assert ratio_ci_width([], []) == float("inf")
