"""Inputs with structure a subsample misses: outliers at random positions.

A reduction computed on every 8th element, or on half the array, is within ~1e-3 of the full result on uniform
inputs: inside what a naive float32 kernel needs as tolerance over 16M elements (its serial sum is 3-6% off),
so every 8th element of mse_loss passed as a 2.3-17x "win". One outlier of magnitude ``range x sqrt(n)``
(within a factor 2 of it, drawn) in the task's first float input carries 25-90% of a sum of squares. A subsample
that misses it is off by its share; one that sees it scales it up by its sampling rate and is off by at least
its share too: no subsample is right, whatever its rate (several outliers could balance out in a subsample that
sees some of them). A linear statistic (smooth_l1_loss) needs a larger one for the same share; its case says how
large (``outlier_magnitude``). For a maximum, more outliers make the largest of them no easier to find.
An honest kernel reads every element and does not notice: its float32 rounding stays within the task's
tolerance (tools/reduction_tolerance.py prints both sides).

Only float arrays of at least ``MIN_ELEMENTS`` get them: below that the "outlier" would be ordinary.
"""

from __future__ import annotations

import math

import numpy as np

MIN_ELEMENTS = 1024


def outlier_magnitude(elements: int, count: int, scale: float) -> float:
    return scale * math.sqrt(elements / count)


def place_outliers(arr: np.ndarray, count: int, scale: float, rng: np.random.Generator,
                   magnitude: float | None = None) -> bool:
    """Put ``count`` outliers of either sign into ``arr`` (in place) at positions drawn from ``rng``; False when
    the array is too small or not float."""
    if arr.dtype.kind != "f" or arr.size < MIN_ELEMENTS or count <= 0:
        return False
    count = min(count, arr.size)
    positions = rng.choice(arr.size, size=count, replace=False)
    typical = magnitude if magnitude is not None else outlier_magnitude(arr.size, count, scale)
    values = typical * np.exp2(rng.uniform(-1.0, 1.0, count)) * rng.choice((-1.0, 1.0), count)
    arr.reshape(-1)[positions] = values.astype(arr.dtype)
    return True
