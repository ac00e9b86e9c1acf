"""query_experience on a generated team memory with ground truth (the corpus of tools/bench_retrieval.py, small):
the answer does not depend on the order lessons were imported in, measured wins for this task and hardware come
first, and a win on another kind of hardware never leads."""

from __future__ import annotations

import pytest

from kope_mcp.bench.retrieval_corpus import CORPUS_HOME, Corpus, generate
from kope_mcp.experience.service import ExperienceService
from kope_mcp.memory.admin import HomeSeal, import_memory
from kope_mcp.services.workbench import Workbench
from tests.conftest import make_settings

pytestmark = pytest.mark.slow  # three imports of a few hundred lessons


def answers(corpus: Corpus, tmp_path, order: str) -> dict[str, list[str]]:
    path = tmp_path / f"{order}.jsonl"
    seal = HomeSeal(CORPUS_HOME, b"the corpus home's key".ljust(32, b"."))
    corpus.write(path, order, seed=3, seal=seal)
    bench = Workbench(make_settings(tmp_path / order.replace(" ", "-")))
    bench.memory.start()
    import_memory(bench.memory, path, seal)  # the home's own memory, not another's
    service = ExperienceService(bench.memory, bench.tasks)
    out = {q.qid: [item.id for item in service.query_experience(
        q.text, task_id=q.task_id, hardware=q.hardware, phase=q.phase).items if item.tier != "hot"]  # type: ignore[arg-type]
        for q in corpus.queries}
    bench.memory.stop()
    bench.store.close()
    return out


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return generate(400, seed=11)


@pytest.fixture(scope="module")
def by_order(corpus, tmp_path_factory) -> dict[str, dict[str, list[str]]]:
    root = tmp_path_factory.mktemp("retrieval")
    return {order: answers(corpus, root, order) for order in ("as generated", "newest first", "shuffled")}


def test_the_answer_does_not_depend_on_the_import_order(by_order):
    first, *others = by_order.values()
    for other in others:
        assert other == first


def test_what_worked_here_is_answered_with_this_tasks_wins_on_this_hardware_and_no_other_kind_leads(corpus, by_order):
    returned = by_order["as generated"]
    for query in corpus.queries:
        if query.kind in ("what_worked_here", "what_worked_other_hw", "natural"):
            assert set(returned[query.qid]) & query.relevant, query
            assert returned[query.qid][0] not in query.must_not_lead, query


def test_a_pasted_compile_error_finds_its_fix_from_another_family(corpus, by_order):
    returned = by_order["as generated"]
    for query in corpus.queries:
        if query.kind == "compile_error":
            assert set(returned[query.qid]) & query.relevant, query
