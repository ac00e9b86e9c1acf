"""The memory's bulk side: statistics, one item in full, and its records in export order, written back one by
one or a chunk of lessons at once. A part of :class:`~kope_mcp.memory.experience_memory.ExperienceMemory` (a mixin), so
that `kope memory` (memory/admin.py) reaches the store, the index and the vectors through the memory's
one front door like every other service."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from kope_mcp.errors import UnknownExperienceError
from kope_mcp.memory.embedder import MODEL_NAME
from kope_mcp.memory.records import AttemptRecord, LessonRecord, SessionRecord, StrategyRecord
from kope_mcp.memory.rows import attempt_from_row, session_from_row

if TYPE_CHECKING:
    from kope_mcp.memory.embedder import BackgroundEmbedder
    from kope_mcp.memory.read_index import ReadIndex
    from kope_mcp.memory.store import KuzuExperienceStore
    from kope_mcp.memory.vectors import VectorIndex


class MemoryStats(BaseModel):
    schema_version: int
    counts: dict[str, int]
    attempts_by_label: dict[str, int]
    hardware: list[str]
    database_bytes: int
    read_index_bytes: int = 0  # memory.kuzu.index: derived from the graph, rebuilt after a crash
    vectors_bytes: int = 0  # memory.kuzu.vectors: the stored embeddings as a mapped bfloat16 matrix
    read_index: str = ""  # whether the read index serves (or is being rebuilt)
    semantic_search: str


class MemoryTransfer:
    store: KuzuExperienceStore
    index: ReadIndex
    vectors: VectorIndex
    embedder: BackgroundEmbedder


    def forget_cached_strategies(self) -> None: ...  # ExperienceMemory's

    @property
    def index_loading(self) -> bool:  # ExperienceMemory's
        raise NotImplementedError

    @property
    def semantic_status(self) -> str:  # ExperienceMemory's
        raise NotImplementedError

    def stats(self) -> MemoryStats:
        store = self.store
        def size(*paths: Path) -> int:
            return sum(p.stat().st_size for p in paths if p.exists())

        index = self.index.path
        return MemoryStats(schema_version=store.schema_version(), counts=store.counts(),
                           attempts_by_label=store.label_counts(), hardware=store.hardware_keys(),
                           database_bytes=size(store.path, Path(f"{store.path}.wal")),
                           read_index_bytes=size(index, Path(f"{index}-wal")) if index else 0,
                           vectors_bytes=size(self.vectors.path) if self.vectors.path else 0,
                           read_index="serving" if self.index.complete else "being rebuilt from the graph"
                           if self.index_loading else "stale (not closed cleanly): rebuilt from the graph when a "
                           "server starts",
                           semantic_search=self.semantic_status)

    def describe(self, item_id: str) -> dict[str, Any]:
        """An attempt (with its successors and lessons), a lesson or a session, in full."""
        store = self.store
        if item_id.startswith("k-") and store.has_node("Attempt", "kernel_id", item_id):
            return {"attempt": store.attempt(item_id).model_dump(),
                    "successors": [s.kernel_id for s in store.successors(item_id)],
                    "lessons": [lesson.model_dump() for lesson in store.lessons_for_attempt(item_id)]}
        if item_id.startswith("x-") and store.has_node("Lesson", "lesson_id", item_id):
            return {"lesson": store.lesson(item_id).model_dump()}
        if item_id.startswith("s-") and store.has_node("Session", "session_id", item_id):
            return {"session": store.session(item_id).model_dump(),
                    "attempts": [{"kernel_id": a.kernel_id, "parent_id": a.parent_id, "label": a.label,
                                  "speedup": a.speedup, "strategy": a.strategy}
                                 for a in store.attempts_in_session(item_id)]}
        raise UnknownExperienceError(item_id)

    def counts(self) -> dict[str, int]:
        return self.store.counts()

    def records(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(kind, fields) of every node, what a kind names before it: tasks, hardware, strategies, sessions,
        attempts (in the database's order: an attempt's parent may come after it, which import takes), lessons,
        embeddings; read a page at a time, so an export's memory does not grow with the memory's size."""
        store = self.store
        yield from (("task", node) for node in store.raw_nodes("Task"))
        yield from (("hardware", node) for node in store.raw_nodes("Hardware"))
        yield from (("strategy", strategy.model_dump()) for strategy in store.strategies())
        for page in store.node_pages("Session"):
            yield from (("session", session_from_row(node).model_dump()) for node in page)
        for page in store.node_pages("Attempt"):
            yield from (("attempt", attempt_from_row(node).model_dump()) for node in page)
        for page in store.node_pages("Lesson"):
            yield from (("lesson", node) for node in page)
        for page in store.node_pages("Embedding"):
            for node in page:
                yield "embedding", {"id": node["id"], "item_kind": node["kind"], "model": MODEL_NAME,
                                    "vector": node["vector"]}

    def add_record(self, kind: str, row: dict[str, Any]) -> bool:
        """Write one record of :meth:`records`' form; False when a node with its id exists (merging skips it)."""
        store = self.store
        if kind == "task":
            if store.has_node("Task", "id", row["id"]):
                return False
            store.upsert_task(row["id"], row["family"], row["level"], row["summary"])
        elif kind == "hardware":
            if store.has_node("Hardware", "key", row["key"]):
                return False
            store.upsert_hardware(row["key"], row["arch"], row["cpu_model"], row["cores"], json.loads(row["isa"]),
                                  json.loads(row["caches"]))
        elif kind == "strategy":
            if store.has_node("Strategy", "strategy_id", row["strategy_id"]):
                return False
            store.add_strategy(StrategyRecord.model_validate(row))
            self.forget_cached_strategies()
        elif kind == "session":
            if store.has_node("Session", "session_id", row["session_id"]):
                return False
            store.add_session(SessionRecord.model_validate(row))
        elif kind == "attempt":
            if store.has_node("Attempt", "kernel_id", row["kernel_id"]):
                return False
            record = AttemptRecord.model_validate(row)
            store.add_attempt(record)
            self.index.upsert_attempt(record)
        elif kind == "lesson":
            if store.has_node("Lesson", "lesson_id", row["lesson_id"]):
                return False
            text = row.pop("search_text", "") or row.get("text", "")
            lesson = LessonRecord.model_validate(row)
            store.add_lesson(lesson, text)
            self.index.add_lesson(lesson, text)
        elif kind == "embedding":
            if store.has_node("Embedding", "id", row["id"]):
                return False
            store.set_embedding(row["id"], row["item_kind"], row["model"], row["vector"])
            self.vectors.add(row["id"], row["item_kind"], row["vector"])
        else:
            raise ValueError(f"unknown kind {kind!r}")
        return True

    def known_ids(self, table: str, key: str, ids: list[str]) -> set[str]:
        """Those of ``ids`` that are nodes of ``table`` (Task, Hardware, Session, Attempt, Strategy, Lesson,
        Embedding)."""
        return self.store.existing_ids(table, key, ids)

    def add_lessons(self, lessons: list[tuple[LessonRecord, str]]) -> None:
        """Write new lessons (with their search texts) at once: one statement and a COPY per edge table."""
        self._beside_the_index(lambda: self.index.add_lessons(lessons), lambda: self.store.bulk_lessons(lessons))

    def add_attempts(self, attempts: list[AttemptRecord]) -> None:
        """Write new attempts at once, their edges to the nodes that exist (the caller checks those that must):
        by COPYs, where one statement per attempt took ~4 ms each (a million: more than an hour)."""
        self._beside_the_index(lambda: self.index.add_attempts([a.__dict__ for a in attempts], replace=False),
                               lambda: self.store.bulk_attempts(attempts))

    def link_parents(self, pairs: list[tuple[str, str]]) -> None:
        """PREV edges (child, parent) between attempts that are both written, for parents that came after their
        children in an import."""
        self.store.bulk_links("PREV", "Attempt", "Attempt", pairs)

    def add_sessions(self, sessions: list[SessionRecord]) -> None:
        """Write new sessions at once, their edges to the tasks and hardware that exist (the caller checks)."""
        self.store.bulk_sessions(sessions)

    def add_embeddings(self, rows: list[tuple[str, str, str, list[float]]]) -> None:
        """(id, kind, model, vector) of items that have none yet: into the graph by CSV COPYs and the vector
        file."""
        self._beside_the_index(lambda: self.vectors.add_many([(i, k, v) for i, k, _, v in rows]),
                               lambda: self.store.bulk_embeddings(rows))

    @staticmethod
    def _beside_the_index(index_them: Callable[[], None], store_them: Callable[[], None]) -> None:
        # The read index (or vector file) takes a chunk on another thread while the graph's COPY runs (Kùzu
        # computes without the GIL): one after the other, the index was ~20% of a million lessons' import.
        failed: list[BaseException] = []

        def run() -> None:
            try:
                index_them()
            except BaseException as exc:  # re-raised on the caller's thread below
                failed.append(exc)

        worker = threading.Thread(target=run, name="kope-import-index")
        worker.start()
        try:
            store_them()
        finally:
            worker.join()
        if failed:
            raise failed[0]

    def strategies(self) -> list[StrategyRecord]:
        """Every strategy node, oldest first."""
        return self.store.strategies()

    @contextmanager
    def all_or_nothing(self) -> Iterator[None]:
        """The block's writes in one transaction of the graph (an admin command's in-place import); a block that
        fails leaves the graph as it was and the read index, which got its rows as they came, to be rebuilt."""
        with self.store.transaction():
            try:
                yield
            except BaseException:
                self.index.invalidate()
                raise

    def prepare_bulk(self) -> None:
        """For an import into a copy nobody serves: indexes built once at the end, no journals (the copy is thrown
        away unless it completes), new nodes by large COPYs and edges once per table at the end (bulk.py)."""
        self.index.bulk()
        self.store.defer_writes()

    def finish_bulk(self, completed: bool) -> None:
        """The nodes and edges held back by :meth:`prepare_bulk`: written when the import completed, else dropped."""
        if completed:
            self.store.write_deferred()
        else:
            self.store.discard_deferred()
