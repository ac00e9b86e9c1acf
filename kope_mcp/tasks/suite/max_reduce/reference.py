import numpy as np


def reference(x, n):
    return np.array([x.max()], dtype=np.float64)
