"""The bench's pieces without servers: the split, the reader's evidence, the static order, the report."""

import json
import shutil

from kope_mcp.bench.agent import TaskRun, evidence, static_order
from kope_mcp.bench.config import BenchConfig, SeedResult, one_core_warmup_tasks, plan, split
from kope_mcp.bench.report import markdown, plots


def test_the_split_keeps_every_family_on_both_sides_and_depends_on_the_seed():
    tasks = {f"{fam}_{i}": fam for fam in ("a", "b", "c") for i in range(4)}
    warm, held = split(tasks, seed=0)
    assert len(warm) == len(held) == 6 and not set(warm) & set(held)
    assert {t.split("_")[0] for t in warm} == {t.split("_")[0] for t in held} == {"a", "b", "c"}
    assert split(tasks, seed=1) != (warm, held) or split(tasks, seed=2) != (warm, held)


def test_with_footprints_each_family_holds_out_its_smallest_task_and_ties_keep_the_seeded_order(tmp_path):
    tasks = {f"{fam}_{i}": fam for fam in ("a", "b") for i in range(6)}
    _, held = split(tasks, seed=0)
    seeded = plan(BenchConfig(out=tmp_path, held_per_family=1), tasks, seed=0)[1]
    assert seeded == [next(t for t in held if t.startswith(f)) for f in ("a", "b")]
    footprints = {t: 1.0 for t in tasks} | {held[-1]: 0.5}  # the last held-out task of family b is the smallest
    config = BenchConfig(out=tmp_path, held_per_family=1, footprints=footprints)
    warm, smallest = plan(config, tasks, seed=0)
    assert smallest == [seeded[0], held[-1]] and not set(warm) & set(smallest)
    assert plan(config, tasks, seed=0) == (warm, smallest)


def test_the_warm_ups_take_the_first_warm_up_tasks_of_each_family(tmp_path):
    tasks = {f"{fam}_{i}": fam for fam in ("a", "b") for i in range(6)}
    warm, _ = split(tasks, seed=0)
    assert one_core_warmup_tasks(BenchConfig(out=tmp_path), tasks, warm) == warm
    one = one_core_warmup_tasks(BenchConfig(out=tmp_path, one_core_per_family=1), tasks, warm)
    assert one == [next(t for t in warm if t.startswith(f)) for f in ("a", "b")]
    capped, held = plan(BenchConfig(out=tmp_path, warm_per_family=2), tasks, seed=0)
    assert sorted(capped) == sorted(t for f in ("a", "b") for t in [w for w in warm if w.startswith(f)][:2])
    assert held == split(tasks, seed=0)[1]  # capping the warm-up holds out nothing more


def test_the_warm_up_order_mixes_families_and_depends_on_the_seed(tmp_path):
    tasks = {f"{fam}_{i}": fam for fam in "abcdef" for i in range(6)}
    orders = [plan(BenchConfig(out=tmp_path), tasks, seed=s)[0] for s in range(3)]
    assert all(sorted(o) == sorted(split(tasks, seed=s)[0]) for s, o in enumerate(orders))
    families = [t[0] for t in orders[0]]
    assert families != sorted(families)  # not family by family
    assert len({tuple(o) for o in orders}) == 3


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


def synthetic_run(task: str, arm: str, seed: int, curve: list[float]) -> TaskRun:
    return TaskRun(task_id=task, family="f", policy=arm, seed=seed, budget=len(curve), attempts=len(curve),
                   first_correct=1, best_speedup=max(curve), best_by_attempt=curve, load=[1.0] * len(curve))


def test_the_report_leads_with_the_memory_curve_and_says_where_active_beats_loses_or_shows_no_difference(tmp_path):
    fast, slow = [4.0, 4.0, 4.0], [1.0, 1.0, 4.0]
    arms = ("none", "static", "oracle", "passive@8k", "active@8k")
    results = []
    for seed in range(2):
        sized = {size: {arm: [synthetic_run(f"t{i}", arm, seed,
                                            fast if arm in ("active@8k", "oracle") or (arm == "passive@8k" and
                                                                                       size == "10") else slow)
                              for i in range(6)] for arm in arms} for size in ("10", "all")}
        results.append(SeedResult(seed=seed, warmup=["w"], held_out=[f"t{i}" for i in range(6)], runs=sized["all"],
                                  sized_runs=sized, memory_attempts={"10": 10, "all": 400}))
    text = markdown(results, 3, 60.0, None, arms, {"t0": 4.0})
    assert text.index("Against memory size") < text.index("## Speedups and tokens")
    assert "| 10 (10) | 3.00 | 3.00 | 1.00 | 1.00 | 1.00 |" in text
    assert "| 8k | passive@8k | -2.00 (-2.00 to -2.00) | 12 | beats passive@8k |" in text
    assert "at 8k, active beats passive@8k, beats static, shows no difference from oracle, beats none" in text
    images = plots(results, 3, tmp_path, arms)
    assert (tmp_path / "memory_curve.png") in images


def test_a_stopped_run_is_re_rendered_from_its_results_json(tmp_path, capsys):
    from kope_mcp.app.cli import main as kope_main
    from kope_mcp.bench.protocol import to_json

    arms = ("none", "active@8k")
    sized = {size: {arm: [synthetic_run("t0", arm, 0, [1.0, 2.0, 2.0])] for arm in arms} for size in ("10", "all")}
    result = SeedResult(seed=0, warmup=["w"], held_out=["t0"], runs=sized["all"], sized_runs=sized,
                        memory_attempts={"10": 10, "all": 50})
    (tmp_path / "results.json").write_text(json.dumps(to_json([result])))
    assert kope_main(["bench", "--report", str(tmp_path)]) == 0
    text = (tmp_path / "report.md").read_text()
    assert "budget 3 attempts" in text and "| 10 (10) |" in text and (tmp_path / "memory_curve.png").exists()
    assert kope_main(["bench", "--report", str(tmp_path / "nothing")]) == 2
    assert "holds no results.json" in capsys.readouterr().err


def test_a_report_of_a_stopped_run_says_which_memory_sizes_are_unfinished():
    arms = ("none", "active@8k")
    full = {arm: [synthetic_run(t, arm, 0, [1.0, 2.0]) for t in ("t0", "t1")] for arm in arms}
    cut = {"none": full["none"], "active@8k": [synthetic_run("t0", "active@8k", 0, [1.0, 2.0])]}
    result = SeedResult(seed=0, warmup=["w"], held_out=["t0", "t1"], runs=full, sized_runs={"10": cut, "all": full},
                        memory_attempts={"10": 10, "all": 50})
    assert "**Partial run**: not every held-out task is finished from the memory of size 10 " in \
        markdown([result], 2, 60.0, None, arms)
    done = SeedResult(seed=0, warmup=["w"], held_out=["t0", "t1"], runs=full, sized_runs={"all": full})
    assert "Partial run" not in markdown([done], 2, 60.0, None, arms)


def test_a_task_with_no_c_baseline_is_left_out_with_its_reason_and_the_rest_are_benched(tmp_path):
    from kope_mcp.bench.runner import benchable
    from kope_mcp.tasks.loader import BASELINE_FILE, TASK_FILE
    from kope_mcp.tasks.registry import SUITE_DIR, TaskRegistry

    for name, keep_baseline in (("relu", True), ("relu_imported", False)):
        folder = tmp_path / name
        shutil.copytree(SUITE_DIR / "relu", folder)
        spec = folder / TASK_FILE
        spec.write_text(spec.read_text().replace('id = "relu"', f'id = "{name}"'))
        if not keep_baseline:  # as a KernelBench problem is imported: its PyTorch reference, no C
            (folder / BASELINE_FILE).unlink()
    tasks, skipped = benchable(TaskRegistry([tmp_path]))
    assert tasks == {"relu": "activation"}
    assert list(skipped) == ["relu_imported"] and "no naive C baseline" in skipped["relu_imported"]
