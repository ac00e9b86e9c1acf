import numpy as np


def reference(x, rows, cols):
    return x.astype(np.float64).sum(axis=0)
