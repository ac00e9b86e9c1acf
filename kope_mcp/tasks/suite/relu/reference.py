import numpy as np


def reference(x, n):
    return np.maximum(x, np.float32(0.0))
