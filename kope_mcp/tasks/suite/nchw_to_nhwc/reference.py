import numpy as np


def reference(x, N, C, H, W):
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1))
