#!/usr/bin/env python3
"""Where the profiling-size tolerance of the sum-like reductions comes from, and what it catches.

For each task whose profiling case is a sum over millions of elements, on inputs drawn exactly as a profile draws
them (its sparse support and outliers, tasks/structure.py), and on a variant of them as a repeated timed call gets
(runtime/variants.py): the error of honest float32 kernels against a compensated float64 reference (math.fsum), a
serial accumulator like the naive baseline and 8 or 16 independent accumulators like an optimised one, next to the
error of kernels that read a subsample and scale up: every 8th element, the first half, the first 3/4 or 7/8, three
elements of every four. The task's profiling tolerance must sit above the honest columns and below every subsample
column, in every draw: the worst honest error and the best subsample error are printed.

    python tools/reduction_tolerance.py --draws 5
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import numpy as np

from kope_mcp.runtime import variants
from kope_mcp.tasks.registry import TaskRegistry

# float32 per-element terms (what a kernel computes before it sums) and how the sum becomes the output.
TERMS: dict[str, tuple[Callable[..., np.ndarray], Callable[[float, int], float]]] = {
    "sum_reduce": (lambda x: x, lambda s, n: s),
    "mse_loss": (lambda a, b: (a - b) * (a - b), lambda s, n: s / n),
    "smooth_l1_loss": (lambda a, b: np.where(np.abs(a - b) < 1, 0.5 * (a - b) ** 2, np.abs(a - b) - 0.5),
                       lambda s, n: s / n),
    "l2_norm": (lambda x: x * x, lambda s, n: math.sqrt(max(s, 0.0))),
}
HONEST = {"serial": 1, "8 acc": 8, "16 acc": 16}


def float32_sum(values: np.ndarray, lanes: int) -> float:
    """Sequential float32 accumulation in ``lanes`` interleaved accumulators, then their float32 sum."""
    usable = values.size - values.size % lanes
    acc = np.cumsum(values[:usable].reshape(-1, lanes), axis=0, dtype=np.float32)[-1]
    return float(np.float32(acc.sum(dtype=np.float32)) + np.float32(values[usable:].sum(dtype=np.float32)))


def subsamples(n: int) -> dict[str, np.ndarray | slice]:
    three_of_four = np.arange(n)[np.arange(n) % 4 != 3]
    return {"every 8th": slice(None, None, 8), "first half": slice(None, n // 2),
            "first 3/4": slice(None, 3 * n // 4), "first 7/8": slice(None, 7 * n // 8), "3 of 4": three_of_four}


def main(args: argparse.Namespace) -> int:
    registry = TaskRegistry.default()
    for task_id, (term, finish) in TERMS.items():
        task = registry.get(task_id)
        profile = task.spec.profile
        tolerance = task.spec.tolerance_for(profile)["float32"]
        allowed = 0.0  # the widest relative error the check accepts: rtol + atol / |output|
        names = [a.name for a in task.spec.args if a.kind == "in"]
        honest = dict.fromkeys(HONEST, 0.0)
        cheat: dict[str, float] = {}
        for draw in range(args.draws):
            drawn = task.case_inputs(profile, 1000 + draw)
            sets = {"drawn": drawn}
            if profile.variants:
                variant = (0x9E3779B97F4A7C15 * (draw + 1)) % (1 << 63)
                sets["variant"] = variants.varied(drawn, variant=variant, seed=77 + draw)
            for label, inputs in sets.items():
                arrays = [inputs[name] for name in names]
                n = arrays[0].size
                terms32 = term(*arrays).astype(np.float32)
                terms64 = term(*[a.astype(np.float64) for a in arrays])
                exact = finish(math.fsum(terms64.tolist()), n)
                allowed = max(allowed, tolerance.rtol + tolerance.atol / abs(exact))
                for name, lanes in HONEST.items():
                    error = abs(finish(float32_sum(terms32, lanes), n) - exact) / abs(exact)
                    honest[name] = max(honest[name], error)
                if label != "drawn":
                    continue
                for name, picked in subsamples(n).items():
                    part = terms64[picked]
                    estimate = finish(math.fsum(part.tolist()) * n / part.size, n)
                    cheat[name] = min(cheat.get(name, math.inf), abs(estimate - exact) / abs(exact))
        print(f"{task_id}: rtol {tolerance.rtol:.0e} atol {tolerance.atol:.0e} (up to {allowed:.1e} of the output), "
              f"sparse 1 in {profile.sparse or 1}, outliers {profile.outliers}, "
              f"variants {'on' if profile.variants else 'off'} ({args.draws} draws)")
        print("  worst honest:     " + "  ".join(f"{k} {v:.1e}" for k, v in honest.items()))
        print("  best subsample:   " + "  ".join(f"{k} {v:.1e}" for k, v in cheat.items()))
        print(f"  the tolerance is {allowed / max(honest.values()):.0f}x the worst honest error and "
              f"1/{min(cheat.values()) / allowed:.0f} of the best subsample's", flush=True)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draws", type=int, default=5)
    raise SystemExit(main(parser.parse_args()))
