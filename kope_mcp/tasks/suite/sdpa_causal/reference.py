import numpy as np


def reference(q, k, v, BH, L, D):
    s = np.matmul(q.astype(np.float64), k.astype(np.float64).transpose(0, 2, 1)) / np.sqrt(D)
    s = np.where(np.tril(np.ones((L, L), dtype=bool))[None], s, -np.inf)
    p = np.exp(s - s.max(axis=2, keepdims=True))
    p /= p.sum(axis=2, keepdims=True)
    return np.matmul(p, v.astype(np.float64))
