import numpy as np


def reference(x, C, H, W):
    OH, OW = max(H // 2, 1), max(W // 2, 1)
    y = np.full((C, OH, OW), -np.inf)
    for p in range(2):
        for q in range(2):
            part = x[:, p::2, q::2][:, :OH, :OW]
            y[:, : part.shape[1], : part.shape[2]] = np.maximum(y[:, : part.shape[1], : part.shape[2]], part)
    return y
