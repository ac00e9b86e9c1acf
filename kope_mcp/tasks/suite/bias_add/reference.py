import numpy as np


def reference(x, bias, rows, cols):
    return x + bias[None, :]
