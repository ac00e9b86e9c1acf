import numpy as np


def reference(x, n):
    import torch  # numpy has no erf; torch's float64 erf is exact to double precision

    t = torch.from_numpy(x.astype(np.float64))
    return (0.5 * t * (1.0 + torch.special.erf(t / np.sqrt(2.0)))).numpy()
