import numpy as np


def reference(x, y, n):
    return np.array([np.dot(x.astype(np.float64), y.astype(np.float64))])
