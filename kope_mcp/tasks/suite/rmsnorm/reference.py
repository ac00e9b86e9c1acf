import numpy as np


def reference(x, gamma, rows, cols):
    x = x.astype(np.float64)
    rms = np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-6)
    return x / rms * gamma.astype(np.float64)[None, :]
