import numpy as np


def generate(rng, V, D, n):
    return {"idx": rng.integers(0, V, size=n, dtype=np.int64)}


def reference(table, idx, V, D, n):
    return table[idx]
