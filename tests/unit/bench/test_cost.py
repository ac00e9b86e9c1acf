"""The model's token estimate before a run, and the budget it stops at."""

import pytest

from kope_mcp.bench.config import BenchConfig
from kope_mcp.bench.cost import BudgetSpent, Meter, estimate, memory_attempts, per_task_tokens


def test_a_passive_reader_costs_more_with_a_larger_memory_until_its_window_caps_every_call():
    small = per_task_tokens("passive@32k", 8, 32_000, 20, 3_000)
    large = per_task_tokens("passive@32k", 8, 32_000, 300, 3_000)
    assert small < large == 8 * 5 * 32_000  # every call a full window
    # active reads its query budget whatever the memory holds; none reads nothing
    assert per_task_tokens("active@32k", 8, 32_000, 20, 3_000) == per_task_tokens("active@32k", 8, 32_000, 900, 3_000)
    assert per_task_tokens("none", 8, 32_000, 900, 3_000) < per_task_tokens("active@32k", 8, 32_000, 900, 3_000)


def test_the_estimate_counts_every_arm_on_the_whole_memory_and_the_arms_on_each_smaller_one(tmp_path):
    config = BenchConfig(out=tmp_path, budget=4, windows=(8_000,), memory_sizes=(10, 10_000),
                         sized_windows=(8_000,), warm_budget=14, one_core_warmup=True)
    assert memory_attempts(config, warm_tasks=6, one_core_tasks=3) == (6 + 3) * 14
    cost = estimate(config, 6, 3, held_out=5, context_window=32_000)
    assert set(cost.per_task) == {*config.arms, "static [10]", "passive@8k [10]", "active@8k [10]"}
    assert cost.total == 5 * sum(cost.per_task.values()) and cost.lines()[0].startswith("estimate: ")


def test_the_meter_stops_the_run_once_the_budget_is_spent():
    meter = Meter(limit=1_000, spent=400)
    meter.check()
    meter.add(500, 99)
    meter.check()
    meter.add(1, 0)
    with pytest.raises(BudgetSpent, match="--resume"):
        meter.check()
    Meter(limit=None, spent=10**12).check()  # no budget: never stops
