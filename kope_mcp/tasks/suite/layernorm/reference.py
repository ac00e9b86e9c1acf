import numpy as np


def reference(x, gamma, beta, rows, cols):
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=1, keepdims=True)
    var = ((x64 - mean) ** 2).mean(axis=1, keepdims=True)
    return (x64 - mean) / np.sqrt(var + 1e-5) * gamma.astype(np.float64) + beta.astype(np.float64)
