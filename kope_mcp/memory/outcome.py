"""Outcome maths from the KOPE paper: step ratio, label, confidence and downstream score.

- Step ratio r = speedup / predecessor's speedup. Every session starts from the task's naive baseline
  (speedup 1 by definition), so a root attempt's predecessor is that baseline and r = its speedup.
- Labels, from the interval of r (the speedup's paired 95% CI over the predecessor's speedup), not its point:
  effective when the whole interval is at or above 1.05, negative when it lies below 0.85, ineffective when it
  lies below 1/1.05, partial otherwise (no loss and no gain of 5% that the measurement guarantees). The paper's
  thresholds, applied to the bound on the side of the claim, and symmetric: identical work measured 1.07-1.10x
  by its point in 2 of 60 profiles here, its CI excluded 1 in about a quarter of the quieter runs, and once
  profiles sample until their CI is within 1.5% the naive kernel against its own baseline came out 0.99x with
  the whole CI below 1 (separate processes differ by about a percent), which "below 1" made a pitfall ("AVOID
  naive baseline") that crowded the matmul win out of the demo's 400-token answer. An attempt that
  did not compile or failed its tests is never promoted (compile_error / incorrect), and a correct attempt that
  was not profiled is `unmeasured`.
- Downstream score d(v) = 0.5 * r_v + 0.5 * 0.7 * sum of d over successors: an attempt is worth what it gained
  plus a discounted share of what was later built on it (a failed attempt has r_v = 0 but still earns credit
  when its fix led somewhere).
"""

from __future__ import annotations

import math
from typing import Literal

Label = Literal["effective", "partial", "ineffective", "negative", "incorrect", "compile_error", "unmeasured"]

EFFECTIVE, INEFFECTIVE = 1.05, 0.85
PARTIAL = 1 / EFFECTIVE  # below this upper bound a loss is as certain as a gain must be to count
DOWNSTREAM_SELF, DOWNSTREAM_CHILD, DOWNSTREAM_DECAY = 0.5, 0.5, 0.7


def step_ratio(speedup: float, predecessor_speedup: float | None) -> float:
    base = predecessor_speedup if predecessor_speedup and predecessor_speedup > 0 else 1.0
    return speedup / base


def label_for(compiled: bool, correct: bool | None, ratio: float | None,
              interval: tuple[float, float] | None = None) -> Label:
    """``interval``: the step ratio's 95% CI (None: only the point is known, as for records of old)."""
    if not compiled:
        return "compile_error"
    if correct is False:
        return "incorrect"
    if correct is None or ratio is None:
        return "unmeasured"
    low, high = interval if interval is not None else (ratio, ratio)
    if low >= EFFECTIVE:
        return "effective"
    if high < INEFFECTIVE:
        return "negative"
    if high < PARTIAL:
        return "ineffective"
    return "partial"


def ratio_interval(ci: tuple[float | None, float | None], predecessor_speedup: float | None,
                   point: float) -> tuple[float, float]:
    """A speedup's CI as a step ratio's (the predecessor's speedup taken as known); the point where a bound is
    missing."""
    base = predecessor_speedup if predecessor_speedup and predecessor_speedup > 0 else 1.0
    low = ci[0] / base if ci[0] is not None else point
    high = ci[1] / base if ci[1] is not None else point
    return min(low, point), max(high, point)


def downstream(ratio: float, successor_scores: list[float]) -> float:
    return DOWNSTREAM_SELF * ratio + DOWNSTREAM_CHILD * DOWNSTREAM_DECAY * sum(successor_scores)


def measurement_confidence(speedup: float, ci: tuple[float, float], noisy: bool) -> float:
    """1 for a tight measurement, less as the speedup's CI widens relative to the speedup; noisy halves it.
    A speedup whose whole CI lies above 1 is a real win however wide: it keeps at least MEASURED_WIN_CONFIDENCE,
    so a busy machine cannot rank it below a lesson nobody measured."""
    width = max(0.0, ci[1] - ci[0]) / speedup if speedup > 0 else 1.0
    confidence = max(0.1, 1.0 - 2.0 * width) * (0.5 if noisy else 1.0)
    if ci[0] > 1.0:
        confidence = max(confidence, MEASURED_WIN_CONFIDENCE)
    return round(confidence, 4)


MEASURED_WIN_CONFIDENCE = 0.5


UNVERIFIED_CONFIDENCE = 0.3  # a lesson nobody measured ranks below measured evidence


def gain_factor(speedup: float | None) -> float:
    """How much a measured speedup is worth as evidence: 0.5 at 1x (or unmeasured), 1 at 2x, 1.5 at 4x, 2 from
    8x on. Logarithmic, so a 6x win outranks a 1.02x tweak clearly but not a 5x win by much."""
    if speedup is None or speedup <= 1.0:
        return 0.5
    return min(2.0, 0.5 + 0.5 * math.log2(speedup))


def lesson_evidence(label: str, speedup: float | None, confidence: float) -> float:
    """The strength of what a lesson reports, independent of the question: a measured win by its speedup, a
    measured failure or a fix (what breaks or how it was mended saves an attempt), unmeasured advice least."""
    if label == "effective":
        return gain_factor(speedup) * max(confidence, UNVERIFIED_CONFIDENCE)
    if label in ("compile_error", "incorrect", "negative"):
        return 0.5 * max(confidence, UNVERIFIED_CONFIDENCE)
    if label in ("partial", "ineffective"):
        return 0.2 * max(confidence, UNVERIFIED_CONFIDENCE)
    return 0.3 * max(confidence, UNVERIFIED_CONFIDENCE)
