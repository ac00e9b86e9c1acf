"""Inputs with structure a subsample misses: a few outliers of spread magnitudes at random positions.

A reduction computed on every 8th element, or on half the array, is within ~1e-3 of the full result on uniform
inputs: inside what a naive float32 kernel needs as tolerance over 16M elements (its serial sum is 3-4% off),
so every 8th element of mse_loss passed as a 2.3-17x "win". With three outliers of magnitude ``range x
sqrt(n / 3)``, each within a factor 2 of it, the outliers carry about half of a sum of squares and the maximum is
one of them. A subsample sees each outlier with its sampling rate: when it misses one the result is off by that
one's share, when it sees one it scales it up by the rate, and the spread magnitudes keep the two from cancelling
(measured on mse_loss at 16M: every 8th element 10-80% off). A linear statistic (smooth_l1_loss) needs larger
ones for the same share; its case says how large (``outlier_magnitude``). An honest kernel reads every element
and does not notice them: its float32 rounding stays within the task's tolerance (tools/reduction_tolerance.py).

Only float arrays of at least ``MIN_ELEMENTS`` get them: below that the "outlier" would be ordinary.
"""

from __future__ import annotations

import math

import numpy as np

MIN_ELEMENTS = 1024


def outlier_magnitude(elements: int, count: int, scale: float) -> float:
    return scale * math.sqrt(elements / count)


def place_outliers(arr: np.ndarray, count: int, scale: float, rng: np.random.Generator,
                   magnitude: float | None = None) -> None:
    """Put ``count`` outliers of either sign into ``arr`` (in place) at positions drawn from ``rng``."""
    if arr.dtype.kind != "f" or arr.size < MIN_ELEMENTS or count <= 0:
        return
    count = min(count, arr.size)
    positions = rng.choice(arr.size, size=count, replace=False)
    typical = magnitude if magnitude is not None else outlier_magnitude(arr.size, count, scale)
    values = typical * np.exp2(rng.uniform(-1.0, 1.0, count)) * rng.choice((-1.0, 1.0), count)
    arr.reshape(-1)[positions] = values.astype(arr.dtype)
