"""Items recorded while semantic search was off get embedded once the model is available."""

import pytest

from kope_mcp.memory.embedder import BackgroundEmbedder
from kope_mcp.memory.store import KuzuExperienceStore
from kope_mcp.services.experience import ExperienceService
from kope_mcp.services.memory import ExperienceMemory
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
