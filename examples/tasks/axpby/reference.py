import numpy as np


def reference(alpha, beta, x, y, n):
    return np.float64(alpha) * x.astype(np.float64) + np.float64(beta) * y.astype(np.float64)
