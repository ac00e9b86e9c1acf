import numpy as np


def reference(a, b, n):
    return (a.astype(np.float64) + b.astype(np.float64)).astype(np.float32)
