"""One tiny ablation run through real `kope serve` processes: the plumbing, not the numbers."""

import json

import anyio
import pytest

from kope_mcp.bench.config import BenchConfig, load_config
from kope_mcp.bench.runner import run_bench

pytestmark = pytest.mark.slow  # a subprocess or a multi-second workflow: not the everyday loop


def test_a_tiny_run_writes_the_report_the_plots_and_per_arm_results_at_two_memory_sizes(tmp_path):
    config = BenchConfig(out=tmp_path / "bench", seeds=1, budget=3, families=("reduction",), per_family=1,
                         profile_s=0.1, windows=(8_000,), memory_sizes=(2,), catalogue_repeats=1)
    report = anyio.run(run_bench, config)
    text = report.read_text()
    for arm in ("none", "static", "oracle", "aa@8k", "shuffled@8k", "passive@8k", "active@8k"):
        assert f"| {arm} |" in text
    assert text.index("## Design and power") < text.index("## Primary") < text.index("## Secondary")
    assert "## A/A control" in text and "## Verdicts met per arm" in text
    assert "| 8k | passive@8k |" in text and "attempts until within 90% of the best known" in text
    assert "| 2 (2) |" in text and "Against memory size" in text  # the curve's row for the cut memory
    assert "| reduction (7) |" in text  # the per-family catalogue, over the family's naive kernels
    assert {p.name for p in config.out.glob("*.png")} >= {"first_correct.png", "speedup.png", "curve.png"}
    (seed,) = json.loads((config.out / "results.json").read_text())
    assert len(seed["held_out"]) == 1 and len(seed["warmup"]) == 1
    assert seed["memory_attempts"]["2"] == 2 < seed["memory_attempts"]["all"]
    runs = {arm: runs[0] for arm, runs in seed["runs"].items()}
    assert runs["none"]["context_tokens"] == 0 and seed["static_order"]
    assert runs["active@8k"]["context_tokens"] > 0 and runs["passive@8k"]["context_tokens"] > 0
    assert runs["active@8k"]["peak_tokens"] <= 8_000 and runs["active@8k"]["items_seen"]
    assert all(0 < r["attempts"] <= 3 and len(r["best_by_attempt"]) == r["attempts"] for r in runs.values())
    # Every arm's incumbents were re-profiled by the judge: a judged curve as long as the run, from its kernels.
    assert all(len(r["judged"]) == r["attempts"] and r["kept"][0][0] == 0 for r in runs.values())
    # Every arm decided on one shared figure per kernel: the A/A arm makes static's choices exactly, and no two
    # arms decided one kernel on different figures.
    assert runs["aa@8k"]["strategies"] == runs["static"]["strategies"]
    assert runs["aa@8k"]["judged"] == runs["static"]["judged"]
    assert all(len(r["decisions"]) <= r["attempts"] for r in runs.values())
    measured = json.loads((config.out / "measured.json").read_text())
    assert {d[1] for r in runs.values() for d in r["decisions"]} <= set(measured)
    assert "pairs decided on different figures: 0**" in text and "Against `static`: primary +0.000" in text
    assert "## Test-retest" in text or not seed["judge_passes"]
    assert all(len(r["load"]) == r["attempts"] for r in runs.values())
    catalogue = json.loads((config.out / "catalogue.json").read_text())
    assert set(catalogue) == set(seed["held_out"]) and catalogue[seed["held_out"][0]]

    # A run stopped in the middle of a task goes on there: the unfinished task is worked again by every arm,
    # finished ones and the warm-up are kept.
    results = config.out / "results.json"
    saved = json.loads(results.read_text())
    del saved[0]["sized_runs"]["all"]["active@8k"]
    results.write_text(json.dumps(saved))
    warm_done = config.out / "seed-0" / "warm.done"
    stamp = warm_done.stat().st_mtime_ns
    resumed = load_config(config.out)
    assert resumed.windows == (8_000,) and resumed.memory_sizes == (2,)
    anyio.run(run_bench, resumed, True)
    (after,) = json.loads(results.read_text())
    def own(runs):  # none and oracle run once, on the whole memory, and are shown at every size
        return {arm: r for arm, r in runs.items() if arm not in ("none", "oracle")}

    assert own(after["sized_runs"]["2"]) == own(seed["sized_runs"]["2"])  # the finished size is kept as it was
    assert after["sized_runs"]["all"]["active@8k"] and after["warmup_seconds"] == seed["warmup_seconds"]
    assert warm_done.stat().st_mtime_ns == stamp
