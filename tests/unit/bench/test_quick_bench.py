"""One tiny ablation run through real `kope serve` processes: the plumbing, not the numbers."""

import json

import anyio
import pytest

from kope_mcp.bench.agent import evidence, static_order
from kope_mcp.bench.protocol import BenchConfig, split
from kope_mcp.bench.runner import run_bench

pytestmark = pytest.mark.slow  # a subprocess or a multi-second workflow: not the everyday loop


def test_a_tiny_run_writes_the_report_the_plots_and_per_policy_results(tmp_path):
    config = BenchConfig(out=tmp_path / "bench", seeds=1, budget=3, families=("reduction",), per_family=1,
                         profile_s=0.1, windows=(8_000,))
    report = anyio.run(run_bench, config)
    text = report.read_text()
    for arm in ("none", "static", "passive@8k", "active@8k"):
        assert f"| {arm} |" in text
    assert "| 8k | passive@8k |" in text and "Attempts until within 90% of the best known" in text
    assert "| reduction (7) |" in text  # the per-family catalogue, over the family's naive kernels
    assert {p.name for p in config.out.glob("*.png")} == {"pass_rate.png", "speedup.png", "curve.png"}
    (seed,) = json.loads((config.out / "results.json").read_text())
    assert len(seed["held_out"]) == 1 and len(seed["warmup"]) == 1
    runs = {policy: runs[0] for policy, runs in seed["runs"].items()}
    assert runs["none"]["context_tokens"] == 0 and seed["static_order"]
    assert runs["active@8k"]["context_tokens"] > 0 and runs["passive@8k"]["context_tokens"] > 0
    assert runs["active@8k"]["peak_tokens"] <= 8_000 and runs["active@8k"]["items_seen"]
    assert all(0 < r["attempts"] <= 3 and len(r["best_by_attempt"]) == r["attempts"] for r in runs.values())


def test_the_split_keeps_every_family_on_both_sides_and_depends_on_the_seed():
    tasks = {f"{fam}_{i}": fam for fam in ("a", "b", "c") for i in range(4)}
    warm, held = split(tasks, seed=0)
    assert len(warm) == len(held) == 6 and not set(warm) & set(held)
    assert {t.split("_")[0] for t in warm} == {t.split("_")[0] for t in held} == {"a", "b", "c"}
    assert split(tasks, seed=1) != (warm, held) or split(tasks, seed=2) != (warm, held)


def item(kind: str, strategy: str, task: str, family: str, label: str, step: float | None = None,
         hardware: str = "hw") -> dict:
    return {"kind": kind, "strategy": strategy, "task_id": task, "family": family, "label": label,
            "step_ratio": step, "confidence": 0.9, "hardware": hardware}


def test_evidence_rewards_measured_steps_on_the_family_and_penalises_pitfalls():
    items = [
        item("case", "fast math", "dot", "reduction", "effective", 2.5),
        item("pitfall", "OpenMP over the outer loop", "sum_reduce", "reduction", "incorrect"),
        item("case", "restrict pointers", "relu", "activation", "effective", 3.0),
        item("fix", "AVX2 horizontal-sum helper", "dot", "reduction", "compile_error"),
        item("case", "unroll by 4", "dot", "reduction", "effective", 2.5, hardware="other"),
        item("target", "", "l2_norm", "reduction", ""),
    ]
    scores = evidence(items, family="reduction", task_id="l2_norm", hardware="hw")
    assert scores["fast math"] > scores["unroll by 4"] > 0  # other hardware counts half
    assert scores["fast math"] > scores["restrict pointers"] > 0  # another family counts a quarter
    assert scores["openmp over the outer loop"] < 0
    assert scores["avx2 horizontal-sum helper"] < 0  # broke, even though it was repaired


def test_the_static_order_pools_every_task_best_first():
    history = {"items": [item("case", "fast math", "dot", "reduction", "effective", 1.5),
                         item("case", "restrict pointers", "relu", "activation", "effective", 3.0),
                         item("pitfall", "vector loop without tail", "relu", "activation", "incorrect")]}
    assert static_order(history) == ["restrict pointers", "fast math", "vector loop without tail"]
