"""With the real all-MiniLM-L6-v2 model: retrieval by meaning, when no word matches."""

import pytest

from kope_mcp.memory.embedder import BackgroundEmbedder
from kope_mcp.memory.store import KuzuExperienceStore
from kope_mcp.services.experience import ExperienceService
from kope_mcp.services.memory import ExperienceMemory
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


def test_a_question_never_waits_behind_the_backlog_and_says_it_answered_without_embeddings(semantic):
    workbench, service = semantic
    model = workbench.memory.embedder
    model._lock.acquire()  # a backlog batch holds the model (as while embedding thousands of imported lessons)
    try:
        answer = service.query_experience("keep working set small enough for the fastest memory", task_id="conv2d")
    finally:
        model._lock.release()
    assert not answer.semantic_search
    assert any("busy embedding" in w for w in answer.warnings), answer.warnings
    again = service.query_experience("keep working set small enough for the fastest memory", task_id="conv2d")
    assert again.semantic_search
