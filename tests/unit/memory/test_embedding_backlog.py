"""Items recorded while semantic search was off get embedded once the model is available."""

import pytest

from kope_mcp.experience.service import ExperienceService
from kope_mcp.memory.embedder import BackgroundEmbedder
from kope_mcp.memory.experience_memory import ExperienceMemory
from kope_mcp.memory.store import KuzuExperienceStore
from kope_mcp.services.workbench import Workbench
from tests.conftest import VECTOR_ADD_OK, make_settings


@pytest.mark.slow
def test_a_restart_with_the_model_embeds_what_was_recorded_without_it(tmp_path, registry):
    settings = make_settings(tmp_path)
    offline = Workbench(settings, registry)
    compiled = offline.compile_kernel("vector_add", VECTOR_ADD_OK, strategy="plain loop")
    lesson = ExperienceService(offline.memory, registry).record_experience("plain loop", "fine", task_id="relu")
    offline.store.close()

    memory = ExperienceMemory(KuzuExperienceStore(settings.memory_path), BackgroundEmbedder(enabled=True))
    memory.start()
    memory.drain(timeout=180)
    embedded = memory.vectors.ids()
    memory.stop()
    assert {compiled.kernel_id, lesson.experience_id, lesson.strategy_id} <= embedded


@pytest.mark.slow
def test_the_backlog_embeds_a_text_shared_by_many_items_once_and_gives_each_item_its_vector(tmp_path):
    import numpy as np

    from kope_mcp.memory.records import LessonRecord

    path = tmp_path / "memory.kuzu"
    store = KuzuExperienceStore(path)
    texts = {f"x-{i:02d}": "unrolled by four, 1.8x" if i % 2 else f"distinct lesson number {i}" for i in range(40)}
    store.bulk_lessons([(LessonRecord(lesson_id=lesson_id, text=text, strategy="", label="lesson", verified=False,
                                      confidence=0.3,
                                      created_at="2026-01-01T00:00:00"), text) for lesson_id, text in texts.items()])
    store.close()
    embedder = BackgroundEmbedder(enabled=True)
    asked: list[str] = []
    embed_batch = embedder.embed_batch

    def counting(batch: list[str]) -> list[list[float]] | None:
        asked.extend(batch)
        return embed_batch(batch)

    embedder.embed_batch = counting  # type: ignore[method-assign]
    memory = ExperienceMemory(KuzuExperienceStore(path), embedder)
    memory.start()
    memory.drain(timeout=180)
    shared = [memory.vector(i) for i, text in texts.items() if text.startswith("unrolled")]
    memory.stop()
    assert set(texts) <= memory.vectors.ids()
    assert asked.count("unrolled by four, 1.8x") == 1 and len(asked) == 21  # 21 distinct texts
    assert all(v is not None and np.allclose(v, shared[0]) for v in shared)


@pytest.mark.slow
def test_while_the_backlog_runs_the_status_says_how_much_semantic_search_covers(tmp_path):
    import threading

    from kope_mcp.memory.records import LessonRecord

    path = tmp_path / "memory.kuzu"
    store = KuzuExperienceStore(path)
    store.bulk_lessons([(LessonRecord(lesson_id=f"x-{i:02d}", text=f"distinct lesson number {i}", strategy="",
                                      label="lesson", verified=False, confidence=0.3,
                                      created_at="2026-01-01T00:00:00"), f"distinct lesson number {i}")
                        for i in range(30)])
    store.close()
    embedder = BackgroundEmbedder(enabled=True)
    release = threading.Event()
    embed_batch = embedder.embed_batch

    def held(batch: list[str]) -> list[list[float]] | None:
        release.wait(timeout=120)
        return embed_batch(batch)

    embedder.embed_batch = held  # type: ignore[method-assign]
    memory = ExperienceMemory(KuzuExperienceStore(path), embedder)
    memory.start()
    try:
        assert embedder.wait(timeout=180)
        for _ in range(600):  # the backlog is queued once the model has loaded
            if memory.backlog:
                break
            threading.Event().wait(0.1)
        status = memory.semantic_status
        assert "covers the 0 items embedded so far" in status and "texts wait for their embedding" in status
    finally:
        release.set()
    memory.drain(timeout=180)
    assert "wait" not in memory.semantic_status and len(memory.vectors) == 30
    memory.stop()
