"""Cases drawn per run near the profiling size, so a kernel cannot special-case the published sizes.

``run_tests`` adds one such case to the task's own: every size that is 16 or more at the profiling size is drawn
log-uniformly in [1/8, 1/4] of it (within an order of magnitude, and at most a quarter of the profiling case's
cost per size, since run_tests runs the float64 reference there too) and made odd (never a multiple of a vector
width); smaller sizes (channels, a kernel's window) stay as profiled. The seed is fresh per run and reported, so a
failure can be reproduced, and ``get_task`` never lists these sizes. The case keeps the profiling case's value
ranges and tolerance: it is of the same order of magnitude.
"""

from __future__ import annotations

import math

import numpy as np

from kope_mcp.tasks.spec import CaseSpec, TaskSpec

_FIXED_BELOW = 16


def draw_case(spec: TaskSpec, seed: int) -> CaseSpec:
    rng = np.random.default_rng(seed)
    sizes: dict[str, int] = {}
    for name, value in spec.profile.sizes.items():
        if value < _FIXED_BELOW:
            sizes[name] = value
            continue
        drawn = int(math.exp(rng.uniform(math.log(value / 8), math.log(value / 4))))
        sizes[name] = max(1, drawn | 1)
    label = "x".join(str(sizes[n]) for n in spec.profile.sizes)
    return CaseSpec(name=f"drawn_{label}", sizes=sizes, ranges=spec.profile.ranges, tolerance=spec.profile.tolerance,
                    note=f"drawn for this run near the profiling size (seed {seed})")
