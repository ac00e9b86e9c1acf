"""Variants of a profile's input sets: what a repeated call is timed on, so that no result can be replayed.

Most tasks' profiling sets are tens of MiB, so a profile's pool holds 2 of them (44 of 53 suite tasks) and every
implementation runs each set many times. A cache keyed by a few sampled input values answered every repeat from the
first call's result (sdpa 10.75-12.0x against 1.35x for the same honest code; gelu 28-33x against 19-22x), and the
check of old (a repeat must reproduce the first result on its set) could not tell. Now every call after the first
on a set runs on a **variant** of it: each float input multiplied element by element by a weight

    w[k] = (BASE + s) + u[(k + r) mod n],    u uniform in [-EPSILON, EPSILON), drawn once per profile and input

with a shift ``r`` and an offset ``s`` in [-SPREAD, SPREAD) drawn per call: w is in [0.5, 1). Every element changes,
never grows (signs, zeros, order of magnitude and outliers kept, so every task's inputs stay valid; a weight up
to 1.5 took an honest serial float32 sum of 16M elements past 2^23, where its additions round, 1.2% off), so a
nonlinear kernel's
cached result is wrong everywhere; and a linear statistic (a sum) moves with ``s``, which no sample of a few
elements pins down to a reduction's tolerance (tens of thousands of random reads, slower than reading it all).
The variant's expected output is unknown to the harness: the coordinator keeps the candidate's outputs of a few
variant calls, drawn after the fact, and the server judges them against the float64 reference on the same
variant (it rebuilds it from the set, the variant id and the profile's seed with these very functions, bit for bit).

Only numpy: the harness imports it in the sandbox.
"""

from __future__ import annotations

import zlib

import numpy as np

BASE = 0.75
EPSILON = np.float32(0.125)
SPREAD = 0.125
#: Variant calls of the candidate whose outputs go back to be judged against the reference.
CHECKED = 2


def noise(seed: int, name: str, size: int) -> np.ndarray:
    """u for one input of one profile (the same in the coordinator, the trusted workers and the server)."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    return (rng.random(size, dtype=np.float32) * np.float32(2) - np.float32(1)) * EPSILON


def parameters(variant: int, size: int) -> tuple[int, np.float32]:
    """(shift r, BASE + s) of a variant id (a positive 63-bit number the protocol drew)."""
    r = int(variant % max(size, 1))
    s = ((variant >> 32) % 4096) / 4096 * 2 * SPREAD - SPREAD
    return r, np.float32(BASE + s)


def vary_into(dest: np.ndarray, source: np.ndarray, u: np.ndarray, variant: int) -> None:
    """dest = source * ((BASE + s) + roll(u, -r)), element by element in float32 (dest may not alias source)."""
    flat_d, flat_s = dest.reshape(-1), source.reshape(-1)
    n = flat_s.size
    r, offset = parameters(variant, n)
    for lo, hi, u_lo in ((0, n - r, r), (n - r, n, 0)):
        if hi > lo:
            part = flat_d[lo:hi]
            np.add(u[u_lo:u_lo + hi - lo], offset, out=part)
            np.multiply(part, flat_s[lo:hi], out=part)


def varies(array: np.ndarray) -> bool:
    """Only float inputs change: integers are indices, counts or labels whose meaning a weight would break."""
    return array.dtype.kind == "f" and array.size > 0


def varied(inputs: dict[str, np.ndarray], variant: int, seed: int) -> dict[str, np.ndarray]:
    """A whole variant of a set's inputs, as the server rebuilds it to judge the candidate's outputs."""
    out = {}
    for name, arr in inputs.items():
        if varies(arr):
            dest = np.empty_like(arr)
            vary_into(dest, np.ascontiguousarray(arr), noise(seed, name, arr.size).astype(arr.dtype), variant)
            out[name] = dest
        else:
            out[name] = arr
    return out
