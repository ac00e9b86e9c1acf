import numpy as np


def reference(A, x, M, N):
    return A.astype(np.float64) @ x.astype(np.float64)
