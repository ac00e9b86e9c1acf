import numpy as np


def reference(x, n):
    x = x.astype(np.float64)
    return np.exp(x)
