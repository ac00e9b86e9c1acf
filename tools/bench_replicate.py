"""Two runs of `kope bench` read as test and retest: does a per-task difference replicate?

    python tools/bench_replicate.py RUN_A/results.json RUN_B/results.json
    python tools/bench_replicate.py docs/bench/results.json <(git show 41e0965:docs/bench/results.json)

For each comparison (active - passive per window, static - none, aa - static) it prints each run's mean paired
difference in the primary metric with its SD, and, over the tasks both runs held out, the Pearson correlation of
the per-task differences: a difference that the memory causes shows up again task by task; one that the noise
decided does not (r near 0).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from kope_mcp.bench.config import SeedResult
from kope_mcp.bench.metrics import area_under_best
from kope_mcp.bench.protocol import from_json


def per_task(results: list[SeedResult], a: str, b: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for result in results:
        runs_b = {r.task_id: r for r in result.runs.get(b, [])}
        for r in result.runs.get(a, []):
            if r.task_id in runs_b and not r.error and not runs_b[r.task_id].error:
                out[f"{result.seed}/{r.task_id}"] = area_under_best(r) - area_under_best(runs_b[r.task_id])
    return out


def pearson(x: list[float], y: list[float]) -> float:
    if len(x) < 3 or statistics.pstdev(x) == 0 or statistics.pstdev(y) == 0:
        return math.nan
    return statistics.correlation(x, y)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first")
    parser.add_argument("second")
    args = parser.parse_args(argv)
    first, second = (from_json(json.loads(Path(path).read_text())) for path in (args.first, args.second))
    arms = {arm for results in (first, second) for r in results for arm in r.runs}
    windows = sorted({arm.partition("@")[2] for arm in arms if arm.startswith("active@")},
                     key=lambda w: int(w.removesuffix("k")))
    comparisons = [(f"active@{w}", f"passive@{w}") for w in windows]
    comparisons += [("static", "none")] + [(aa, "static") for aa in sorted(a for a in arms if a.startswith("aa@"))]
    print(f"{'comparison':<28} {'first: mean (SD)':>20} {'second: mean (SD)':>20} {'tasks':>6} {'r':>6}")
    for a, b in comparisons:
        one, two = per_task(first, a, b), per_task(second, a, b)
        if not one or not two:
            continue
        both = sorted(set(one) & set(two))
        sd = [statistics.stdev(d.values()) if len(d) > 1 else math.nan for d in (one, two)]
        r = pearson([one[t] for t in both], [two[t] for t in both])
        print(f"{a + ' - ' + b:<28} {statistics.fmean(one.values()):+9.3f} ({sd[0]:.3f}) "
              f"{statistics.fmean(two.values()):+11.3f} ({sd[1]:.3f}) {len(both):>6} {r:>+6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
