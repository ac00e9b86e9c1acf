#!/usr/bin/env python3
"""Where the profiling-size tolerance of the outlier reductions comes from, and what it catches.

For each task whose profiling case carries outliers, on inputs drawn exactly as a profile draws them: the error
of honest float32 kernels against a compensated float64 reference (math.fsum), a serial accumulator like the
naive baseline and 8 or 16 independent accumulators like an optimised one, next to the error of kernels that
read a subsample (every 8th or 16th element, the first half) and scale up. The task's tolerance must sit above
the honest column and below the subsample columns.

    python tools/reduction_tolerance.py --draws 5
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import numpy as np

from kope_mcp.tasks.registry import TaskRegistry

# float32 per-element terms (what a kernel computes before it sums) and how the sum becomes the output.
TERMS: dict[str, tuple[Callable[..., np.ndarray], Callable[[float, int], float]]] = {
    "mse_loss": (lambda a, b: (a - b) * (a - b), lambda s, n: s / n),
    "smooth_l1_loss": (lambda a, b: np.where(np.abs(a - b) < 1, 0.5 * (a - b) ** 2, np.abs(a - b) - 0.5),
                       lambda s, n: s / n),
    "l2_norm": (lambda x: x * x, lambda s, n: math.sqrt(max(s, 0.0))),
}


def float32_sum(values: np.ndarray, lanes: int) -> float:
    """Sequential float32 accumulation in ``lanes`` interleaved accumulators, then their float32 sum."""
    usable = values.size - values.size % lanes
    acc = np.cumsum(values[:usable].reshape(-1, lanes), axis=0, dtype=np.float32)[-1]
    return float(np.float32(acc.sum(dtype=np.float32)) + np.float32(values[usable:].sum(dtype=np.float32)))


def main(args: argparse.Namespace) -> int:
    registry = TaskRegistry.default()
    print(f"{'task':<16} {'rtol':>6} {'serial':>9} {'8 acc':>9} {'16 acc':>9} {'every 8th':>10} {'every 16th':>11} "
          f"{'first half':>11}   (worst honest / best subsample relative error over {args.draws} draws)")
    for task_id, (term, finish) in TERMS.items():
        task = registry.get(task_id)
        profile = task.spec.profile
        rtol = task.spec.tolerance_for(profile)["float32"].rtol
        honest: dict[str, float] = {"serial": 0.0, "8": 0.0, "16": 0.0}
        cheat: dict[str, float] = {"8th": math.inf, "16th": math.inf, "half": math.inf}
        for draw in range(args.draws):
            inputs = task.case_inputs(profile, 1000 + draw)
            arrays = [inputs[a.name] for a in task.spec.args if a.kind == "in"]
            n = arrays[0].size
            terms32 = term(*arrays).astype(np.float32)
            exact = finish(math.fsum(term(*[a.astype(np.float64) for a in arrays]).tolist()), n)
            for name, lanes in (("serial", 1), ("8", 8), ("16", 16)):
                honest[name] = max(honest[name], abs(finish(float32_sum(terms32, lanes), n) - exact) / abs(exact))
            for name, picked in (("8th", slice(None, None, 8)), ("16th", slice(None, None, 16)),
                                 ("half", slice(None, n // 2))):
                part = term(*[a[picked].astype(np.float64) for a in arrays])
                estimate = finish(math.fsum(part.tolist()) * n / part.size, n)
                cheat[name] = min(cheat[name], abs(estimate - exact) / abs(exact))
        print(f"{task_id:<16} {rtol:>6.0e} {honest['serial']:>9.1e} {honest['8']:>9.1e} {honest['16']:>9.1e} "
              f"{cheat['8th']:>10.1e} {cheat['16th']:>11.1e} {cheat['half']:>11.1e}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draws", type=int, default=5)
    raise SystemExit(main(parser.parse_args()))
