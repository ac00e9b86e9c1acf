import numpy as np


def reference(x, mean, var, gamma, beta, N, C, H, W):
    f = lambda a: a.astype(np.float64)[None, :, None, None]  # noqa: E731 (broadcast over N, H, W)
    return (x.astype(np.float64) - f(mean)) / np.sqrt(f(var) + 1e-5) * f(gamma) + f(beta)
