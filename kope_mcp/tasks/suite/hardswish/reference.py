import numpy as np


def reference(x, n):
    x = x.astype(np.float64)
    return x * np.clip(x + 3.0, 0.0, 6.0) / 6.0
