"""Cases drawn per run near the profiling size, so a kernel cannot special-case the published sizes.

``run_tests`` adds one such case to the task's own. Sizes that are 16 or more at the profiling size are drawn,
each log-uniformly in [(1/8)^(1/d), (1/4)^(1/d)] of its profiling value where d is how many are drawn, and made
odd (never a multiple of a vector width): the case holds 1/8 to 1/4 of the profiling case's elements, the same
order of magnitude at a fraction of its cost (run_tests runs the float64 reference there too), and well above
every published case. Smaller sizes (channels, a kernel's window) stay as profiled. The seed is fresh per run and
reported, so a failure can be reproduced, and ``get_task`` never lists these sizes. The case keeps the profiling
case's value ranges, sparse support, outliers and tolerance.
"""

from __future__ import annotations

import math

import numpy as np

from kope_mcp.tasks.spec import CaseSpec, TaskSpec

_FIXED_BELOW = 16


def draw_case(spec: TaskSpec, seed: int) -> CaseSpec:
    rng = np.random.default_rng(seed)
    drawn = [name for name, value in spec.profile.sizes.items() if value >= _FIXED_BELOW]
    low, high = math.log(1 / 8) / max(1, len(drawn)), math.log(1 / 4) / max(1, len(drawn))
    sizes = dict(spec.profile.sizes)
    for name in drawn:
        sizes[name] = max(1, int(sizes[name] * math.exp(rng.uniform(low, high))) | 1)
    label = "x".join(str(sizes[n]) for n in spec.profile.sizes)
    return CaseSpec(name=f"drawn_{label}", sizes=sizes, ranges=spec.profile.ranges, tolerance=spec.profile.tolerance,
                    outliers=spec.profile.outliers, outlier_magnitude=spec.profile.outlier_magnitude,
                    sparse=spec.profile.sparse,
                    note=f"drawn for this run near the profiling size (seed {seed})")
