import numpy as np


def reference(a, b, n):
    d = a.astype(np.float64) - b.astype(np.float64)
    return np.array([np.mean(d * d)])
