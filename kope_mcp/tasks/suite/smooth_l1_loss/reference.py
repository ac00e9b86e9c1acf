import numpy as np


def reference(a, b, n):
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return np.array([np.where(d < 1.0, 0.5 * d * d, d - 0.5).mean()])
