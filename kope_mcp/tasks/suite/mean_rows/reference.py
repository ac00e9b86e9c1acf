import numpy as np


def reference(x, rows, cols):
    return x.astype(np.float64).mean(axis=1)
