import numpy as np


def reference(x, w, C, F, H, W):
    xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(1, 2))[:, ::2, ::2]
    return np.einsum("cijpq,fcpq->fij", windows, w.astype(np.float64))
