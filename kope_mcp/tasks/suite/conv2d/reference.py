import numpy as np


def reference(x, w, C, F, H, W, KH, KW):
    oh, ow = H - KH + 1, W - KW + 1
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    y = np.zeros((F, oh, ow))
    for p in range(KH):
        for q in range(KW):
            window = x64[:, p : p + oh, q : q + ow]  # C x oh x ow
            y += np.einsum("fc,chw->fhw", w64[:, :, p, q], window)
    return y
