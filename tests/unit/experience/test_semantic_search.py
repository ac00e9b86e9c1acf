"""With the real all-MiniLM-L6-v2 model: retrieval by meaning, when no word matches."""

import pytest

from kope_mcp.experience.service import ExperienceService
from kope_mcp.memory.embedder import BackgroundEmbedder
from kope_mcp.memory.experience_memory import ExperienceMemory
from kope_mcp.memory.store import KuzuExperienceStore
from kope_mcp.services.workbench import Workbench
from tests.conftest import make_settings


@pytest.fixture(scope="module")
def semantic(tmp_path_factory, registry):
    home = tmp_path_factory.mktemp("semantic-home")
    settings = make_settings(home, embeddings=True)
    memory = ExperienceMemory(KuzuExperienceStore(settings.memory_path), BackgroundEmbedder(enabled=True))
    memory.start()
    assert memory.embedder.wait(timeout=180), memory.embedder.status
    workbench = Workbench(settings, registry, memory)
    yield workbench, ExperienceService(memory, registry)
    memory.stop()


def test_a_lesson_is_found_by_meaning_when_no_word_matches(semantic):
    workbench, service = semantic
    lesson = service.record_experience(
        "cache blocking", "Tile the matrices so each block stays resident in L1; it cut DRAM traffic a lot.",
        task_id="matmul")
    workbench.memory.drain()
    answer = service.query_experience("keep working set small enough for the fastest memory", task_id="conv2d")
    assert answer.semantic_search
    hit = next((i for i in answer.items if i.id == lesson.experience_id), None)
    assert hit is not None and "cosine" in hit.why


def test_a_question_is_answered_by_meaning_while_the_backlog_is_being_embedded(semantic):
    workbench, service = semantic
    memory = workbench.memory
    for n in range(1500):  # as after importing thousands of lessons (strategies: never a query's candidate)
        memory.enqueue_embedding("strategy", f"st-filler-{n}", f"filler strategy number {n} about loop order")
    answer = service.query_experience("keep working set small enough for the fastest memory", task_id="conv2d")
    still_queued = memory.backlog
    memory.drain(timeout=120)
    assert still_queued > 0  # the question did not wait for the backlog
    assert answer.semantic_search, answer.warnings
    assert any("cosine" in item.why for item in answer.items)
    assert memory.backlog == 0
