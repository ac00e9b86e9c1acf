import numpy as np


def reference(a, b, rows, ca, cb):
    return np.concatenate([a, b], axis=1)
