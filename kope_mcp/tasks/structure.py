"""Inputs with structure a subsample misses: a sparse support and outliers at random positions.

A reduction computed on every 8th element, or on 3/4 of the array scaled up, is within ~1e-3 of the full result
on dense uniform inputs: inside what a naive float32 kernel needs as tolerance over 16M dense elements (its serial
sum is 3-13% off once the accumulator's ulp outgrows the terms), so subsamples passed as wins whenever the draw
was kind. Two structures close that, at the profiling size and in the case run_tests draws near it:

- **A sparse support** (``sparse = k``): one element in k, at random positions (the same positions in every float
  input of that shape, so a difference of two inputs is zero off the support), holds a value; the rest are exactly
  zero. A serial float32 sum then adds only n/k terms into an accumulator k times smaller, and an honest kernel is
  within ~5e-6 of the float64 sum at 16M elements, serial or vectorised: the task's own tolerance applies at the
  profiling size, not a loose one. Every element still has to be read: the time is that of a dense input.
- **Outliers** (``outliers``): one of magnitude ``range x sqrt(support)`` (within a factor 2 of it, drawn) in the
  task's first float input carries 20-80% of a sum of squares. A subsample that misses it is off by its share; one
  that sees it scales it up by its sampling rate and is off by share x (1/rate - 1): 3/4 of the data is 7% off or
  more, 7/8 3% (several outliers could balance out in a subsample that sees some of them). A linear statistic
  needs a larger one for the same share; its case says how large (``outlier_magnitude``). An input whose range
  has one sign gets outliers of that sign (a sum of [0, 1) values stays far from zero). For a maximum, more
  outliers make the largest of them no easier to find.

tools/reduction_tolerance.py prints the honest and the subsample errors side by side. Only float arrays of at
least ``MIN_ELEMENTS`` get either: below that the structure would be ordinary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

MIN_ELEMENTS = 1024


def outlier_magnitude(elements: int, count: int, scale: float) -> float:
    return scale * math.sqrt(elements / count)


def support(size: int, sparse: int, rng: np.random.Generator) -> np.ndarray | None:
    """The sorted flat positions that keep a value when one element in ``sparse`` does; None: all of them."""
    if sparse <= 1 or size < MIN_ELEMENTS:
        return None
    return np.sort(rng.choice(size, size=max(1, size // sparse), replace=False))


def sparsify(arrays: Sequence[np.ndarray], kept: np.ndarray) -> None:
    """Zero every element of ``arrays`` (float, one shape) outside the flat positions ``kept``, in place."""
    for arr in arrays:
        flat = arr.reshape(-1)
        values = flat[kept].copy()
        flat[:] = 0
        flat[kept] = values


def place_outliers(arr: np.ndarray, count: int, scale: float, rng: np.random.Generator,
                   magnitude: float | None = None, kept: np.ndarray | None = None,
                   sign: float | None = None) -> bool:
    """Put ``count`` outliers into ``arr`` (in place) at positions drawn from ``rng`` (among ``kept`` when the
    input is sparse), of ``sign`` or of either sign; False when the array is too small or not float."""
    if arr.dtype.kind != "f" or arr.size < MIN_ELEMENTS or count <= 0:
        return False
    pool_size = arr.size if kept is None else kept.size
    count = min(count, pool_size)
    picked = rng.choice(pool_size, size=count, replace=False)
    positions = picked if kept is None else kept[picked]
    typical = magnitude if magnitude is not None else outlier_magnitude(pool_size, count, scale)
    spread = np.exp2(rng.uniform(-1.0, 1.0, count))
    signs = np.full(count, sign) if sign is not None else rng.choice((-1.0, 1.0), count)
    values = typical * spread * signs
    arr.reshape(-1)[positions] = values.astype(arr.dtype)
    return True
