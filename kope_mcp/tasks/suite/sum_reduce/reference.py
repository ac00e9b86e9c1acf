import numpy as np


def reference(x, n):
    return np.array([x.astype(np.float64).sum()])
