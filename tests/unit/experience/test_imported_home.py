"""A home made of imports: everything it knows was measured elsewhere, so it is all cold evidence, and an answer
still fills the budget it was given (the cold tier takes the slots the warm tier left)."""

from __future__ import annotations

from kope_mcp.experience.config import PRESETS
from kope_mcp.experience.service import ExperienceService
from kope_mcp.memory.admin import import_memory
from kope_mcp.memory.experience_memory import ExperienceMemory
from kope_mcp.tasks.registry import TaskRegistry
from tests.unit.memory.test_memory_import_chunks import attempt, write_export

STRATEGIES = ["unroll by four", "vectorise with AVX2", "branch-free select", "restrict pointers", "prefetch ahead",
              "fuse the passes", "align to 64 bytes", "software pipelining", "split the loop", "peel the tail",
              "block for L1", "two accumulators", "gather into registers", "nontemporal stores", "hoist the bounds"]


def test_a_home_of_imports_fills_its_budget_with_marked_cold_evidence(tmp_path, registry: TaskRegistry):
    attempts = []
    for n, strategy in enumerate(STRATEGIES, start=1):
        record = attempt(n * 3, parent=None)  # every third is labelled effective
        attempts.append(record.model_copy(update={"strategy": strategy, "strategy_id": None, "speedup": 1.5 + n,
                                                  "speedup_ci_low": 1.2 + n, "speedup_ci_high": 1.8 + n,
                                                  "step_ratio": 1.5 + n, "confidence": 0.9}))
    path = tmp_path / "export.jsonl"
    write_export(path, attempts)
    memory = ExperienceMemory.open(tmp_path / "memory.kuzu", embeddings=False)
    try:
        import_memory(memory, path)
        evidence = PRESETS["evidence"]
        for config, most in ((evidence, None), (evidence.model_copy(update={"cold_takes_unused_warm": False}), 6)):
            answer = ExperienceService(memory, registry, config=config).query_experience(
                "make relu faster", task_id="relu", token_budget=4000)
            cases = [i for i in answer.items if i.kind == "case"]
            assert all(i.tier == "cold" and "imported" in i.why for i in cases)
            if most is not None:
                assert len([i for i in answer.items if i.tier != "hot"]) <= most  # the cap alone: as before
            else:
                assert len(cases) >= 10, [i.text[:60] for i in answer.items]
    finally:
        memory.close()
