import numpy as np


def reference(x, C, H, W):
    xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    return np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(1, 2))[:, ::2, ::2].max(axis=(3, 4))
