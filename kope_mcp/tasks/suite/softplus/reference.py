import numpy as np


def reference(x, n):
    x = x.astype(np.float64)
    return np.where(x > 20.0, x, np.logaddexp(0.0, x))
