import numpy as np


def reference(x, C, H, W, pad):
    return np.pad(x, ((0, 0), (pad, pad), (pad, pad)))
