"""Robust timing statistics: median, IQR and a distribution-free confidence interval of the median."""

from __future__ import annotations

import math

import numpy as np

from kope_mcp.models import TimingStats
from kope_mcp.runtime.measurement import median_ci95

__all__ = ["median_ci95", "paired_speedup", "ratio_spread", "summarize"]


def summarize(samples: list[float], calls_per_sample: int) -> TimingStats:
    arr = np.asarray(samples, dtype=np.float64)
    q1, median, q3 = (float(v) for v in np.percentile(arr, [25, 50, 75]))
    lo, hi = median_ci95(arr)
    return TimingStats(
        median_s=median,
        iqr_s=q3 - q1,
        ci95_low_s=lo,
        ci95_high_s=hi,
        n=len(arr),
        calls_per_sample=calls_per_sample,
        relative_iqr=(q3 - q1) / median if median > 0 else math.inf,
    )


def paired_speedup(slow: list[float], fast: list[float]) -> tuple[float, tuple[float, float]]:
    """Median and CI of per-round ratios slow/fast: rounds are interleaved, so drift cancels within a pair."""
    ratios = np.asarray(slow, dtype=np.float64) / np.asarray(fast, dtype=np.float64)
    return float(np.median(ratios)), median_ci95(ratios)


def ratio_spread(slow: list[float], fast: list[float]) -> float:
    """The relative IQR of the per-round ratios slow/fast (inf when there are none)."""
    ratios = np.asarray(slow, dtype=np.float64) / np.asarray(fast, dtype=np.float64)
    if not ratios.size:
        return math.inf
    q1, median, q3 = np.percentile(ratios, [25, 50, 75])
    return float((q3 - q1) / median) if median > 0 else math.inf
