"""One tiny ablation run through real `kope serve` processes: the plumbing, not the numbers."""

import json

import anyio
import pytest

from kope_mcp.bench.agent import evidence
from kope_mcp.bench.protocol import BenchConfig, split
from kope_mcp.bench.runner import run_bench

pytestmark = pytest.mark.slow  # a subprocess or a multi-second workflow: not the everyday loop


def test_a_tiny_run_writes_the_report_the_plots_and_per_policy_results(tmp_path):
    config = BenchConfig(out=tmp_path / "bench", seeds=1, budget=3, families=("reduction",), per_family=1,
                         profile_s=0.1)
    report = anyio.run(run_bench, config)
    text = report.read_text()
    for policy in ("none", "passive", "active"):
        assert f"| {policy} |" in text
    assert "| reduction (7) |" in text  # the per-family catalogue, over the family's naive kernels
    assert {p.name for p in config.out.glob("*.png")} == {"pass_rate.png", "speedup.png", "curve.png"}
    (seed,) = json.loads((config.out / "results.json").read_text())
    assert len(seed["held_out"]) == 1 and len(seed["warmup"]) == 1
    runs = {policy: runs[0] for policy, runs in seed["runs"].items()}
    assert runs["none"]["context_tokens"] == 0
    assert runs["active"]["context_tokens"] > 0 and runs["passive"]["context_tokens"] > 0
    assert all(0 < r["attempts"] <= 3 and len(r["best_by_attempt"]) == r["attempts"] for r in runs.values())


def test_the_split_keeps_every_family_on_both_sides_and_depends_on_the_seed():
    tasks = {f"{fam}_{i}": fam for fam in ("a", "b", "c") for i in range(4)}
    warm, held = split(tasks, seed=0)
    assert len(warm) == len(held) == 6 and not set(warm) & set(held)
    assert {t.split("_")[0] for t in warm} == {t.split("_")[0] for t in held} == {"a", "b", "c"}
    assert split(tasks, seed=1) != (warm, held) or split(tasks, seed=2) != (warm, held)


def test_evidence_rewards_measured_steps_on_the_family_and_penalises_pitfalls():
    context = (
        "- [win, step x2.50, 2.50x vs naive, confidence 0.90] dot (reduction): fast math; flags -O3 -ffast-math "
        "(k-1, hw)\n"
        "- AVOID OpenMP over the outer loop on sum_reduce (reduction): wrong results (mismatch) (k-2, hw)\n"
        "- [win, step x3.00, 3.00x vs naive, confidence 0.90] relu (activation): restrict pointers; flags - (k-3, hw)\n"
        "- dot: AVX2 horizontal-sum helper failed with `compile: unknown type name` (k-4); fixed by k-5: include "
        "immintrin.h\n"
    )
    scores = evidence(context, family="reduction", task_id="l2_norm")
    assert scores["fast math"] > scores["restrict pointers"] > 0
    assert scores["openmp over the outer loop"] < 0
    assert scores["avx2 horizontal-sum helper"] < 0  # broke, even though it was repaired
