import numpy as np


def reference(x, rows, cols):
    return np.cumprod(x.astype(np.float64), axis=1)
