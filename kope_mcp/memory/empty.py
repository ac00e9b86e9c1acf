"""The memory of a home that has none yet (no database file): every read query_experience makes, answered empty.

The stdio proxy selects context from it while a new home's first daemon starts (app/proxy_early.py), so the
first question on a new home is answered at once, as the daemon would answer it. It reads only: a question with
a session_id, or anything that writes, waits for the daemon. A test asks the same questions of it and of a new
ExperienceMemory and finds the same answers, so a read added to the selection without one here fails there.
"""

from __future__ import annotations

from typing import Any

from kope_mcp.memory.embedder import EMBEDDINGS_OFF, LOADING
from kope_mcp.memory.records import AttemptRecord, LessonRecord


class EmptyMemory:
    index_loading = False
    semantic_ready = False

    def __init__(self, embeddings: bool) -> None:
        # What a daemon starting now says until its model has loaded: the answer it would give.
        self.semantic_status = LOADING if embeddings else EMBEDDINGS_OFF

    def wait_index(self, timeout: float = 0.0) -> bool:
        return True

    def embed_question(self, text: str) -> list[float] | None:
        return None

    def nearest(self, vector: list[float], limit: int) -> list[tuple[str, str, float]]:
        return []

    def vector(self, item_id: str) -> Any:
        return None

    def full_text(self, query: str, limit: int, postings_budget: int | None = None) -> list[tuple[str, str, float]]:
        return []

    def attempts_for_task(self, task_id: str, limit: int) -> list[AttemptRecord]:
        return []

    def attempts_for_family(self, family: str, exclude_task: str | None, limit: int) -> list[AttemptRecord]:
        return []

    def attempts_for_strategy(self, strategy_id: str, limit: int) -> list[AttemptRecord]:
        return []

    def attempts_with_signature(self, signature: str, limit: int) -> list[AttemptRecord]:
        return []

    def best_attempts(self, limit: int) -> list[AttemptRecord]:
        return []

    def attempts_by_id(self, kernel_ids: list[str]) -> list[AttemptRecord]:
        return []

    def lessons_by_id(self, lesson_ids: list[str]) -> list[LessonRecord]:
        return []

    def lessons_about(self, kernel_ids: list[str]) -> list[LessonRecord]:
        return []

    def scoped_lessons(self, task_id: str | None, family: str | None, hardware: str | None, limit: int,
                       by: str = "evidence") -> list[LessonRecord]:
        return []

    def fixes_of(self, failing: list[AttemptRecord]) -> dict[str, AttemptRecord]:
        return {}
